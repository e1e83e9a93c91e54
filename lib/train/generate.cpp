// Sampling from a token model: the sampler, the cached autoregressive loop, and `gputrain generate` around them.
#include "train/generate.h"

#include "core/parallel.h"
#include "ops/devices.h"
#include "train/resume.h"
#include "train/setup.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

namespace gt {

int64_t sample_token(const std::vector<double>& logits, const SamplingConfig& s, Rng& rng) {
  std::vector<int64_t> cand;
  cand.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) cand.push_back(static_cast<int64_t>(i));
  if (cand.empty()) throw Error("generate: the model's logits are not finite (NaN or infinite): are the weights?");
  auto more_likely = [&](int64_t a, int64_t b) {
    const double la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  if (s.temperature == 0) return *std::min_element(cand.begin(), cand.end(), more_likely);
  if (s.top_k > 0 && s.top_k < static_cast<int64_t>(cand.size())) {
    std::partial_sort(cand.begin(), cand.begin() + s.top_k, cand.end(), more_likely);
    cand.resize(static_cast<size_t>(s.top_k));
    std::sort(cand.begin(), cand.end());  // the draw walks the kept tokens in index order
  }
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i : cand) mx = std::max(mx, logits[static_cast<size_t>(i)]);
  std::vector<double> w(cand.size());
  double total = 0;
  for (size_t k = 0; k < cand.size(); ++k) {
    w[k] = std::exp((logits[static_cast<size_t>(cand[k])] - mx) / s.temperature);
    total += w[k];
  }
  const double u = static_cast<double>(rng.next_u64() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  for (size_t k = 0; k < cand.size(); ++k) {
    acc += w[k];
    if (u < acc) return cand[k];
  }
  // Rounding left u at or past the last partial sum: the last token with any weight.
  for (size_t k = cand.size(); k-- > 0;)
    if (w[k] > 0) return cand[k];
  return cand.back();
}

std::string token_model_problem(const Model& model) {
  const Shape& in = model.input_shape();
  if (in.rank() != 1) return fmt::format("its input is {} per sample, not a sequence [T] of token ids", in.str());
  const Shape& out = model.output_shape();
  if (out.rank() != 2 || out[0] != in[0])
    return fmt::format("its output is {} per sample, not logits [T, V] = [{}, V]", out.str(), in[0]);
  for (const GraphNode& n : model.nodes()) {
    const bool reads_input = std::find(n.inputs.begin(), n.inputs.end(), -1) != n.inputs.end();
    if (!reads_input) continue;
    if (n.type != "embedding")
      return fmt::format("layer \"{}\" ({}) reads the input, which only embedding layers may (it holds token ids)",
                         n.name, n.type);
    const int64_t rows = n.layer->shared_weight_shape()[0];
    if (rows < out[1])
      return fmt::format(
          "it predicts {} tokens but embedding \"{}\" has {} rows, so a predicted token could not be fed back", out[1],
          n.name, rows);
  }
  const std::string why = model.decode_unsupported();
  return why.empty() ? "" : why + ", so generate cannot decode it with a key/value cache";
}

Generator::Generator(Model& model, const SamplingConfig& s)
    : m_model(model), m_cfg(s), m_rng(s.seed, /*stream=*/0x6E4E) {
  const std::string why = token_model_problem(model);
  GT_CHECK(why.empty(), "Generator: {}", why);
  m_window = model.input_shape()[0];
  m_vocab = model.output_shape()[1];
  m_host_in = Tensor::empty(Shape{m_window}, model.dtype());
  m_dev_in = model.device().is_cpu() ? m_host_in : Tensor::empty(Shape{m_window}, model.dtype(), model.device());
  m_host_logits = Tensor::empty(Shape{m_vocab}, model.dtype());
  m_logits.resize(static_cast<size_t>(m_vocab));
}

void Generator::run(const std::vector<int64_t>& tokens, int64_t position) {
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t k = 0; k < n; ++k) {
    const auto v = static_cast<double>(tokens[static_cast<size_t>(k)]);
    if (m_model.dtype() == DType::f64)
      m_host_in.data<double>()[k] = v;
    else
      m_host_in.data<float>()[k] = static_cast<float>(v);
  }
  const Tensor x = m_dev_in.narrow0(n).view(Shape{1, n});
  if (!m_model.device().is_cpu()) x.view(Shape{n}).copy_from(m_host_in.narrow0(n));
  const Tensor& y = m_model.forward_decode(x, position);
  m_host_logits.copy_from(y.view(Shape{n, m_vocab}).slice0(n - 1, 1).view(Shape{m_vocab}));
  for (int64_t v = 0; v < m_vocab; ++v)
    m_logits[static_cast<size_t>(v)] =
        m_model.dtype() == DType::f64 ? m_host_logits.data<double>()[v] : m_host_logits.data<float>()[v];
}

void Generator::start(const std::vector<int64_t>& prompt) {
  GT_CHECK(!prompt.empty(), "Generator::start without a prompt");
  for (int64_t t : prompt) GT_CHECK(t >= 0 && t < m_vocab, "prompt token {} outside [0, {})", t, m_vocab);
  const size_t keep = std::min(prompt.size(), static_cast<size_t>(m_window));
  m_context.assign(prompt.end() - static_cast<std::ptrdiff_t>(keep), prompt.end());
  m_pending = -1;
  m_slides = 0;
  run(m_context, 0);
}

void Generator::feed(int64_t token) {
  if (static_cast<int64_t>(m_context.size()) < m_window) {
    m_context.push_back(token);
    run({token}, static_cast<int64_t>(m_context.size()) - 1);
    return;
  }
  // The window is full: keep the newest ⌈T/2⌉ tokens (the new one included) and run them again from position 0.
  const int64_t keep = m_window - m_window / 2;
  std::vector<int64_t> kept(m_context.end() - (keep - 1), m_context.end());
  kept.push_back(token);
  m_context = std::move(kept);
  ++m_slides;
  run(m_context, 0);
}

int64_t Generator::next() {
  GT_CHECK(!m_context.empty(), "Generator::next before start");
  if (m_pending >= 0) feed(m_pending);
  m_pending = sample_token(m_logits, m_cfg, m_rng);
  return m_pending;
}

namespace {

// GPT-2's <|endoftext|>, where llm.c starts its samples.
constexpr int64_t kGpt2EndOfText = 50256;

std::vector<int64_t> parse_prompt(const GenerateOptions& opts, bool bytes, int64_t vocab) {
  std::vector<int64_t> ids;
  if (!opts.has_prompt) {
    if (bytes) return {'\n'};
    return {vocab > kGpt2EndOfText ? kGpt2EndOfText : 0};
  }
  if (bytes) {
    for (unsigned char c : opts.prompt) ids.push_back(c);
  } else {
    size_t i = 0;
    const std::string& p = opts.prompt;
    while (i < p.size()) {
      if (p[i] == ',' || std::isspace(static_cast<unsigned char>(p[i]))) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < p.size() && p[j] != ',' && !std::isspace(static_cast<unsigned char>(p[j]))) ++j;
      const std::string word = p.substr(i, j - i);
      int64_t v = -1;
      if (word.size() <= 18 && std::all_of(word.begin(), word.end(), [](char c) { return c >= '0' && c <= '9'; }))
        v = std::stoll(word);
      if (v < 0 || v >= vocab)
        throw ConfigError(
            fmt::format("--prompt: \"{}\" is not a token id in [0, {}) (this model's vocabulary is not "
                        "bytes, so the prompt is ids separated by commas or spaces)",
                        word.substr(0, 40), vocab));
      ids.push_back(v);
      i = j;
    }
  }
  if (ids.empty()) throw ConfigError("--prompt: empty; give at least one token, or leave it out for the default");
  return ids;
}

}  // namespace

GenerateSummary generate_text(const Experiment& exp, const GenerateOptions& opts,
                              const std::function<void(const std::string&)>& out) {
  if (opts.tokens < 0) throw ConfigError(fmt::format("--tokens: expected 0 or more, got {}", opts.tokens));
  if (!std::isfinite(opts.sampling.temperature) || opts.sampling.temperature < 0)
    throw ConfigError(fmt::format("--temperature: expected a finite number ≥ 0, got {}", opts.sampling.temperature));
  if (opts.sampling.top_k < 0)
    throw ConfigError(fmt::format("--top-k: expected 0 or more, got {}", opts.sampling.top_k));
  set_num_threads(opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::string reason;
  const Device device = resolve_device(exp.devices.empty() ? exp.device : exp.devices[0], reason);
  Model model = Model::build(exp.model, model_input_shape(exp), DType::f32, device, exp.seed);
  const std::string why = token_model_problem(model);
  if (!why.empty()) exp.model.where.fail("generate needs a token model: " + why);
  load_finite_weights(model, weights_file(opts.checkpoint, exp.checkpoint));
  model.allocate(1);

  GenerateSummary r;
  Generator gen(model, opts.sampling);
  r.window = gen.window();
  r.vocab = gen.vocab();
  r.bytes = r.vocab == 256;
  const std::vector<int64_t> prompt = parse_prompt(opts, r.bytes, r.vocab);
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  auto show = [&](int64_t token, bool first) {
    if (r.bytes)
      out(std::string(1, static_cast<char>(static_cast<unsigned char>(token))));
    else
      out(fmt::format("{}{}", first ? "" : " ", token));
  };
  for (size_t k = 0; k < prompt.size(); ++k) show(prompt[k], k == 0);
  const auto t0 = std::chrono::steady_clock::now();
  gen.start(prompt);
  for (int64_t k = 0; k < opts.tokens; ++k) show(gen.next(), false);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.bytes) out("\n");
  r.new_tokens = opts.tokens;
  r.slides = gen.slides();
  return r;
}

}  // namespace gt
