// Loss dispatch, the shape rules that tie the model output to the targets, and the loss section of the config.
#include "train/loss.h"

#include "config/choice.h"
#include "config/schema.h"
#include "ops/loss.h"

namespace gt {
namespace {

const Choice<LossType> kLossTypes[] = {
    {LossType::cross_entropy, "cross_entropy"},
    {LossType::mse, "mse"},
};

}  // namespace

const std::string& to_string(LossType type) { return choice_name(kLossTypes, type); }

namespace {

const SectionSpec& loss_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "type", .kind = KeyKind::choice, .required = true, .choices = choice_names(kLossTypes)},
          {.name = "label_smoothing",
           .kind = KeyKind::number,
           .min = 0,
           .max = 1,
           .fallback = "0",
           .doc = "cross_entropy only: PyTorch's label smoothing"},
          {.name = "ignore_index",
           .kind = KeyKind::integer,
           .nullable = true,
           .min = INT32_MIN,
           .max = INT32_MAX,
           .fallback = "null",
           .doc = "cross_entropy only: targets of this value count nowhere (null: none)"},
      },
      "the loss and its options");
  return s;
}

}  // namespace

const KeySpec& loss_key() {
  static const KeySpec k{
      .name = "loss",
      .kind = KeyKind::any_of,
      .items = {{.name = "type", .kind = KeyKind::choice, .choices = choice_names(kLossTypes)},
                {.name = "loss", .kind = KeyKind::map, .section = &loss_section()}},
      .fallback = "cross_entropy",
      .doc = "cross_entropy (log-softmax + NLL) or mse (mean over all elements), or a map with type: and options"};
  return k;
}

void parse_loss(const ConfigNode& n, LossConfig& out) {
  if (n.is_scalar()) {
    out.type = parse_choice(n, kLossTypes);
    return;
  }
  const std::vector<KeySpec>& keys = section_keys(loss_section());
  expect_keys(n, keys);
  n.require("type");
  out.type = parse_choice(n["type"], kLossTypes);
  out.label_smoothing = get_double(n, key_spec(keys, "label_smoothing"));
  if (out.label_smoothing != 0 && out.type != LossType::cross_entropy)
    n["label_smoothing"].fail("applies to cross_entropy only");
  // Labels are int32: an ignore_index outside that range could never match one. null: none.
  if (n.has("ignore_index")) {
    if (out.type != LossType::cross_entropy) n["ignore_index"].fail("applies to cross_entropy only");
    const KeySpec& k = key_spec(keys, "ignore_index");
    out.ignore_index = n["ignore_index"].as_int(static_cast<int64_t>(k.min), static_cast<int64_t>(k.max));
  }
}

YAML::Node to_yaml(const LossConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["type"] = to_string(c.type);
  if (c.type == LossType::cross_entropy) {
    n["label_smoothing"] = c.label_smoothing;
    n["ignore_index"] = c.ignore_index == ops::kNoIgnore ? YAML::Node() : YAML::Node(c.ignore_index);
  }
  return n;
}

void check_loss_fits(const LossConfig& loss, const Shape& output, const Dataset& data, const ConfigNode& where,
                     const Dataset* test) {
  if (loss.type == LossType::cross_entropy) {
    if (data.num_classes == 0)
      where.fail("cross_entropy needs class labels, but the data has regression targets (use loss: mse)");
    if (output.rank() == 1 && output[0] < data.num_classes) {
      const int64_t classes = output[0];
      for (const Dataset* d : {&data, test}) {
        if (!d || d->labels_source.empty() || !d->targets.defined() || d->num_classes <= classes) continue;
        const int32_t* y = d->targets.data<int32_t>();
        for (int64_t i = 0; i < d->size(); ++i)
          if (y[i] >= classes)
            throw DataError(
                fmt::format("{}: label {} at sample {} is not one of the model's {} classes (0 to {}): "
                            "the last layer's output is {} {}",
                            d->labels_source, y[i], i, classes, classes - 1, output.str(), where.where()));
      }
    }
    // A tokenizer whose ids the model cannot all predict (nor embed): named, with both sizes. (An explicit
    // data.vocab_size below the tokenizer's vouches that the data's ids stay below it: the shards are checked.)
    const int64_t tokenizer_vocab = data.tokenizer ? data.tokenizer->vocab_size() : 0;
    if (output.rank() == 2 && output[1] < tokenizer_vocab && data.num_classes >= tokenizer_vocab)
      where.fail(fmt::format(
          "the tokenizer {} has a vocabulary of {} tokens, larger than the model's output {} ({} "
          "classes): size the embedding and the last layer to {}",
          data.tokenizer_path, data.tokenizer->vocab_size(), output.str(), output[1], data.tokenizer->vocab_size()));
    // Token data without data.vocab_size: a single token past 255 makes the vocabulary GPT-2's, so a byte model's
    // output no longer fits. Name that token and where it is, not only the shapes.
    if (data.tokens && data.tokens->first_past_bytes() && output.rank() == 2 && output[1] != data.num_classes) {
      const TokenAt& at = *data.tokens->first_past_bytes();
      where.fail(fmt::format(
          "the model's output {} has {} classes, but the data's vocabulary is {}: with no data.vocab_size, {} holds "
          "token {} at position {} (past 255), which makes it GPT-2's; set data.vocab_size, or write byte tokens "
          "only",
          output.str(), output[1], data.num_classes, at.path, at.id, at.position));
    }
    const Shape target = data.target_shape();
    if (target.rank() == 1) {  // sequences: a class per token
      const int64_t t = target[0];
      if (output.rank() != 2 || output[0] != t || output[1] != data.num_classes)
        where.fail(
            fmt::format("cross_entropy over sequences of {} targets and {} classes needs a model output of "
                        "[{}, {}] (a row of logits per position), got {}",
                        t, data.num_classes, t, data.num_classes, output.str()));
      return;
    }
    if (output.rank() != 1 || output[0] != data.num_classes)
      where.fail(fmt::format("cross_entropy over {} classes needs a model output of [{}], got {}", data.num_classes,
                             data.num_classes, output.str()));
  } else {
    if (data.num_classes > 0)
      where.fail("mse needs numeric targets, but the data has class labels (use loss: cross_entropy)");
    if (output.numel() != data.target_shape().numel())
      where.fail(
          fmt::format("mse: model output {} does not match targets {}", output.str(), data.target_shape().str()));
  }
}

void compute_loss(const LossConfig& loss, const Tensor& out, const Tensor& target, double scale, Tensor& dout,
                  Tensor& stats) {
  const int64_t batch = out.dim(0);
  if (loss.type == LossType::cross_entropy) {
    // Sequences: a row of logits per target, T rows per sample.
    const int64_t per_sample = target.rank() == 2 ? target.dim(1) : 1;
    const int64_t rows = batch * per_sample;
    const Tensor logits = out.view(Shape{rows, rows > 0 ? out.numel() / rows : 0});
    Tensor dlogits = dout.defined() ? dout.view(logits.shape()) : Tensor();
    ops::cross_entropy(logits, target.view(Shape{rows}), loss.label_smoothing, scale, dlogits, stats,
                       {.group = per_sample, .ignore_index = loss.ignore_index});
    return;
  }
  const Tensor out2 = out.view(Shape{batch, out.numel() / batch});
  Tensor dout2 = dout.defined() ? dout.view(out2.shape()) : Tensor();
  ops::mse(out2, target.view(out2.shape()), scale, dout2, stats);
}

}  // namespace gt
