// Evaluation: test-set metrics of a model, during a run (logged and written as `eval` rows) and for `gputrain eval`.
#pragma once

#include "core/tensor.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/experiment.h"

#include <cstdint>
#include <optional>
#include <string>

namespace gt {

class Communicator;
class MetricsSink;
class Model;

struct EvalResult {
  double loss = 0;                 ///< mean over the test samples
  std::optional<double> accuracy;  ///< classification only
  std::optional<double> bpb;       ///< token data with known bytes: the loss in bits per byte (bits_per_byte)
  int64_t samples = 0;             ///< evaluated (token data: windows, limited by train.eval_tokens)
};

/// A mean loss (nats per target token) over the windows evaluate() takes of `test`, in bits per byte of text: the
/// loss of all the targets over their UTF-8 bytes (the tokenizer's token_bytes; the end-of-text id counts none), so
/// that models of different vocabularies compare. Bytes: loss / ln 2. Nothing when the tokens' bytes are unknown.
std::optional<double> bits_per_byte(const Dataset& test, const Experiment& exp, double loss);

/// Test-set metrics of `model` in evaluation mode, through the batch tensors x and y (on the model's device; their
/// first dimension is the batch) and `stats` (f64[2] there). With several ranks each evaluates every world-th batch
/// and the sums are reduced, so every sample counts once. Token data: the test windows front to back, the first
/// ⌈train.eval_tokens / T⌉ of them when eval_tokens is set; the loss and accuracy are per token. With data.tta.hflip
/// each batch is run twice, as loaded and mirrored left-right, and the loss and accuracy are those of the mean of the
/// two outputs.
EvalResult evaluate(Model& model, const Experiment& exp, const Dataset& test, Tensor& x, Tensor& y, Tensor& stats,
                    Communicator& comm);

/// data.tta needs [C, H, W] samples: otherwise a config error naming data.tta.
void check_tta(const Experiment& exp, const Shape& sample);

/// A training run's evaluations: when they are due, and what they leave (the progress's test metrics, a log line,
/// an `eval` row).
class Evaluator {
 public:
  /// Evaluates `model` on `test` (empty: never due) through the run's batch tensors x and y.
  Evaluator(const Experiment& exp, Model& model, const Dataset& test, Tensor& x, Tensor& y, Communicator& comm);

  /// After step p.step (`last`: the run's last step): every train.eval_every steps and after the last one.
  bool due_after_step(const TrainProgress& p, bool last) const;
  /// At an epoch's end: with train.eval_every 0, unless that step was just evaluated.
  bool due_at_epoch_end(const TrainProgress& p) const;
  /// Evaluates, records the metrics in `p`, logs them and writes the eval row.
  void run(TrainProgress& p, MetricsSink& metrics);

 private:
  const Experiment& m_exp;
  Model& m_model;
  const Dataset& m_test;
  Tensor& m_x;
  Tensor& m_y;
  Communicator& m_comm;
  Tensor m_stats;  ///< the evaluation's sums (loss, hits) on the device
};

/// What `gputrain eval` prints.
struct EvalSummary {
  int64_t samples = 0;
  double loss = 0;
  std::optional<double> accuracy;
  std::optional<double> bpb;
  int64_t tokens = 0;  ///< token data: the predicted tokens evaluated
};
/// Test-set metrics of the experiment's model with the weights `weights_path` names (a safetensors file, a
/// checkpoint folder, or a run directory: its final weights, else its newest good checkpoint's).
EvalSummary evaluate_weights(const Experiment& exp, const std::string& weights_path, int threads);

}  // namespace gt
