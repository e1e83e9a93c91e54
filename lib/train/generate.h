// Sampling text from a token model (`gputrain generate`): autoregressive, with a key/value cache, so each new token
// costs one position of the model rather than a forward pass over the whole prefix.
#pragma once

#include "core/rng.h"
#include "graph/model.h"
#include "train/experiment.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gt {

struct SamplingConfig {
  double temperature = 1.0;  ///< 0: greedy (argmax); else logits are divided by it before the softmax
  int64_t top_k = 0;         ///< draw among the k most likely tokens only; 0 (or ≥ V): among all
  uint64_t seed = 0;         ///< the draws' stream: a fixed seed gives the same tokens
  double top_p = 1.0;        ///< then among the most likely tokens whose probabilities sum to p at least (nucleus)
};

/// The next token from one row of logits [V]: at temperature 0 the argmax (the lowest index among equal maxima),
/// else a draw from softmax(logits / temperature) restricted to the top_k largest (ties to the lower index), with
/// 53-bit uniforms from `rng`; with top_p < 1 only the most likely of those whose probabilities (after the
/// temperature) first reach top_p in sum take part. Non-finite logits are never chosen; throws gt::Error when none is
/// finite.
int64_t sample_token(const std::vector<double>& logits, const SamplingConfig& s, Rng& rng);

/// Why generate cannot sample from `model` ("" when it can): it must read a sequence [T] of token ids through
/// embedding layers, end in logits [T, V], compute position by position (Model::decode_unsupported), and feed back
/// any of the V tokens it can predict.
std::string token_model_problem(const Model& model);

/// Autoregressive sampling from a token model with weights, allocated for at least one sample. Positions are
/// limited to the model's T (its per-sample input [T], the data's block size): when a new token would not fit, the
/// window slides, keeping the newest ⌈T/2⌉ tokens, which go through the model again in one call at positions
/// 0 … (so the cache is rebuilt once every ⌊T/2⌋ tokens: the context is always the last T/2 to T tokens).
class Generator {
 public:
  Generator(Model& model, const SamplingConfig& s);

  /// Starts a sequence from `prompt` (at least one id, each in [0, vocab())); of a prompt longer than T the last T
  /// tokens are kept. One call runs the whole prompt through the model (the prefill).
  void start(const std::vector<int64_t>& prompt);
  /// Samples the next token from the logits of the last position, and returns it. It is fed to the model (one
  /// position, through the cache) when the token after it is asked for, so the last token costs nothing.
  int64_t next();

  int64_t window() const { return m_window; }
  int64_t vocab() const { return m_vocab; }
  /// The logits the next token is drawn from (those of the last position fed), as doubles.
  const std::vector<double>& logits() const { return m_logits; }
  /// The tokens at positions 0 … of the cache, in order (the last T/2 to T of the sequence).
  const std::vector<int64_t>& context() const { return m_context; }
  /// Times the window slid so far.
  int64_t slides() const { return m_slides; }

 private:
  void feed(int64_t token);
  // Runs tokens at positions [position, position + n) and keeps the logits of the last.
  void run(const std::vector<int64_t>& tokens, int64_t position);

  Model& m_model;
  SamplingConfig m_cfg;
  Rng m_rng;
  int64_t m_window = 0, m_vocab = 0, m_slides = 0;
  int64_t m_pending = -1;  // sampled but not fed yet
  std::vector<int64_t> m_context;
  std::vector<double> m_logits;
  Tensor m_host_in, m_dev_in, m_host_logits;
};

/// What `gputrain generate` was asked for besides the config.
struct GenerateOptions {
  std::string checkpoint;  ///< weights: as `gputrain eval` takes them
  std::string prompt;      ///< text for a model with a tokenizer (or bytes), token ids (comma or space separated) else
  bool has_prompt = false;
  std::string tokenizer;    ///< the tokenizer file ("": data.tokenizer, the run's copy, the one beside the shards)
  bool stop_at_end = true;  ///< stop at the end-of-text id (not printed)
  std::string stop;         ///< stop where the new text contains this (not printed)
  int64_t tokens = 256;     ///< new tokens to produce
  SamplingConfig sampling;
  int threads = 0;  ///< CPU threads (0: all cores)
};

struct GenerateSummary {
  int64_t prompt_tokens = 0, new_tokens = 0, window = 0, vocab = 0, slides = 0;
  double seconds = 0;     ///< the generation proper: prefill and sampling, not loading
  bool bytes = false;     ///< a byte model (V = 256): text, not ids
  bool text = false;      ///< text was printed (a tokenizer, or bytes), not ids
  std::string tokenizer;  ///< its file, or "" (bytes without one, or ids)
  std::string stopped;    ///< why it stopped before --tokens: "end-of-text", "--stop", or ""
};

/// Loads the experiment's model with the weights opts.checkpoint names, runs opts.prompt through it and writes the
/// prompt and then each new token to `out` as soon as it is drawn (raw bytes for a byte model, whose prompt is the
/// UTF-8 of opts.prompt; space-separated ids and a newline otherwise). Default prompt: "\n" for bytes, else
/// GPT-2's <|endoftext|> (50256) when the vocabulary has it, else token 0. Throws ConfigError for options or a model
/// that cannot generate, and gt::Error for weights that do not load.
GenerateSummary generate_text(const Experiment& exp, const GenerateOptions& opts,
                              const std::function<void(const std::string&)>& out);

}  // namespace gt
