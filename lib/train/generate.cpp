// Sampling from a token model: the sampler, the cached autoregressive loop, and `gputrain generate` around them.
#include "train/generate.h"

#include "core/parallel.h"
#include "ops/devices.h"
#include "text/load.h"
#include "train/resume.h"
#include "train/run_dir.h"
#include "train/setup.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
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
  auto weight = [&](int64_t i) { return std::exp((logits[static_cast<size_t>(i)] - mx) / s.temperature); };
  if (s.top_p < 1) {  // the nucleus: the most likely first, until their share reaches top_p
    double all = 0;
    for (int64_t i : cand) all += weight(i);
    std::sort(cand.begin(), cand.end(), more_likely);
    double acc = 0;
    size_t keep = 0;
    while (keep < cand.size() && (keep == 0 || acc < s.top_p * all)) acc += weight(cand[keep++]);
    cand.resize(keep);
    std::sort(cand.begin(), cand.end());
  }
  std::vector<double> w(cand.size());
  double total = 0;
  for (size_t k = 0; k < cand.size(); ++k) {
    w[k] = weight(cand[k]);
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

// Which tokenizer turns the ids into text: --tokenizer, data.tokenizer, the run's copy, the one beside the shards.
std::string tokenizer_file(const Experiment& exp, const GenerateOptions& opts, const std::string& weights) {
  if (!opts.tokenizer.empty()) return opts.tokenizer;
  if (exp.data.tokenizer_given) return exp.data.tokenizer;
  if (std::string f = run_tokenizer_file(weights); !f.empty()) return f;
  if (exp.data.tokenizer.empty()) return "";
  std::error_code ec;  // found by the config's pattern, before any file was looked at: there still?
  return std::filesystem::is_regular_file(exp.data.tokenizer, ec) ? exp.data.tokenizer : "";
}

// Bytes on their way out: what would end inside a UTF-8 sequence, or could be the start of the stop string, waits
// for the next token.
class TextOut {
 public:
  TextOut(const std::function<void(const std::string&)>& out, std::string stop) : m_out(out), m_stop(std::move(stop)) {}
  /// Adds bytes; false when the stop string is now complete (the text before it is out).
  bool add(const std::string& bytes) {
    m_held += bytes;
    if (!m_stop.empty())
      if (const size_t at = m_held.find(m_stop); at != std::string::npos) {
        emit(at);
        m_held.clear();  // the stop string and what came with it are not printed
        return false;
      }
    size_t n = m_held.size() - std::min(m_held.size(), m_stop.empty() ? 0 : m_stop.size() - 1);
    n = complete_prefix(n);
    emit(n);
    return true;
  }
  void flush() { emit(m_held.size()); }

 private:
  // The longest prefix of m_held's first n bytes that ends between UTF-8 characters (at most 3 bytes shorter).
  size_t complete_prefix(size_t n) const {
    for (size_t back = 1; back <= 4 && back <= n; ++back) {
      const auto c = static_cast<uint8_t>(m_held[n - back]);
      if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
      const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
      return len > back ? n - back : n;
    }
    return n;  // not UTF-8 (five continuation bytes): out as it is
  }
  void emit(size_t n) {
    if (n == 0) return;
    m_out(m_held.substr(0, n));
    m_held.erase(0, n);
  }
  const std::function<void(const std::string&)>& m_out;
  std::string m_stop, m_held;
};

}  // namespace

GenerateSummary generate_text(const Experiment& exp, const GenerateOptions& opts,
                              const std::function<void(const std::string&)>& out) {
  if (opts.tokens < 0) throw ConfigError(fmt::format("--tokens: expected 0 or more, got {}", opts.tokens));
  if (!std::isfinite(opts.sampling.temperature) || opts.sampling.temperature < 0)
    throw ConfigError(fmt::format("--temperature: expected a finite number ≥ 0, got {}", opts.sampling.temperature));
  if (opts.sampling.top_k < 0)
    throw ConfigError(fmt::format("--top-k: expected 0 or more, got {}", opts.sampling.top_k));
  if (!(opts.sampling.top_p > 0 && opts.sampling.top_p <= 1))
    throw ConfigError(fmt::format("--top-p: expected a number in (0, 1], got {}", opts.sampling.top_p));
  set_num_threads(opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::string reason;
  const Device device = resolve_device(exp.devices.empty() ? exp.device : exp.devices[0], reason);
  Model model = Model::build(exp.model, model_input_shape(exp), DType::f32, device, exp.seed);
  const std::string why = token_model_problem(model);
  if (!why.empty()) exp.model.where.fail("generate needs a token model: " + why);
  const std::string weights = weights_file(opts.checkpoint, exp.checkpoint);
  GenerateSummary r;
  r.tokenizer = tokenizer_file(exp, opts, opts.checkpoint.empty() ? weights : opts.checkpoint);
  std::unique_ptr<Tokenizer> tok;
  if (!r.tokenizer.empty()) tok = load_tokenizer(r.tokenizer);
  load_finite_weights(model, weights);
  model.allocate(1);

  Generator gen(model, opts.sampling);
  r.window = gen.window();
  r.vocab = gen.vocab();
  r.bytes = r.vocab == 256 && (!tok || tok->kind() == "bytes");
  r.text = tok || r.bytes;
  // The end-of-text id, or -1 (none, or no tokenizer).
  const int64_t eot = tok && tok->end_of_text() ? static_cast<int64_t>(*tok->end_of_text()) : -1;
  std::vector<int64_t> prompt;
  const bool encodes = tok && tok->encodes();  // (llm.c's gpt2_tokenizer.bin only decodes: the prompt is ids then)
  if (encodes) {  // the text after an end-of-text id, as the documents of the training data start
    if (eot >= 0) prompt.push_back(eot);
    for (const uint32_t id : tok->encode(opts.has_prompt ? opts.prompt : std::string(eot >= 0 ? "" : "\n")))
      prompt.push_back(id);
    if (prompt.empty()) throw ConfigError("--prompt: empty, and the tokenizer has no end-of-text id to start from");
  } else {
    prompt = parse_prompt(opts, r.bytes, r.vocab);
  }
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  TextOut text(out, opts.stop);
  if (encodes && opts.has_prompt) out(opts.prompt);
  if (tok && !encodes) {
    std::vector<uint32_t> ids(prompt.begin(), prompt.end());
    out(tok->decode(ids));
  }
  if (!tok)
    for (size_t k = 0; k < prompt.size(); ++k)
      out(r.bytes ? std::string(1, static_cast<char>(prompt[k])) : fmt::format("{}{}", k ? " " : "", prompt[k]));
  const auto t0 = std::chrono::steady_clock::now();
  gen.start(prompt);
  for (int64_t k = 0; k < opts.tokens; ++k) {
    const int64_t id = gen.next();
    ++r.new_tokens;
    if (opts.stop_at_end && id == eot) {
      r.stopped = "end-of-text";
      break;
    }
    // A model's padded rows past the tokenizer's vocabulary (GPT-2's 50304 of 50257) stand for no text.
    const bool known = tok && id < static_cast<int64_t>(tok->vocab_size());
    const std::string piece = known     ? tok->token_bytes(static_cast<uint32_t>(id))
                              : tok     ? std::string()
                              : r.bytes ? std::string(1, static_cast<char>(id))
                                        : fmt::format(" {}", id);
    if (!text.add(piece)) {
      r.stopped = "--stop";
      break;
    }
  }
  text.flush();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.text) out("\n");
  r.slides = gen.slides();
  return r;
}

}  // namespace gt
