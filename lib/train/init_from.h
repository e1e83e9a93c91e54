// train.init_from: a new run's weights taken from another run, a safetensors file or an llm.c checkpoint, renamed
// (init_map), partly kept fresh (init_skip), matched strictly or not (init_strict).
#pragma once

#include "train/experiment.h"
#include "train/run_dir.h"

#include <cstdint>
#include <string>
#include <vector>

namespace gt {

class Model;

/// What was loaded, for the log and summary.json: the file, its bytes' FNV-1a, and the model's tensors by outcome.
struct InitWeights {
  std::string file;            ///< the file read ("" when the run starts from its own initialisation)
  std::string fnv1a;           ///< of the file's bytes, 8 hex digits
  int64_t loaded = 0;          ///< model tensors copied from the file
  int64_t fresh_adapters = 0;  ///< LoRA adapter tensors the file lacks, which keep their initialisation
  std::vector<std::string> skipped = {}, missing = {}, unexpected = {};  ///< init_skip's; not in the file; only in it
};

/// The file train.init_from names: an llm.c checkpoint as it is, else what `gputrain eval --checkpoint` reads
/// (weights_file: a safetensors file, a checkpoint folder's weights, a run directory's final or newest good ones).
/// Throws ConfigError for a path that is none of them.
std::string init_weights_file(const Experiment& exp);

/// Copies the tensors of `file` (init_weights_file's) into `model`'s parameters and buffers, after its names are
/// renamed by train.init_map; the model's names that train.init_skip matches keep their values. A tied weight is one
/// tensor under both names. Throws ConfigError at train.init_from for a shape or dtype that differs, and, with
/// train.init_strict, for any missing or unexpected tensor, naming them.
InitWeights load_init_weights(const Experiment& exp, const std::string& file, Model& model);

/// The lines that say what load_init_weights did: the file and its hash, what was skipped, and (init_strict false)
/// what was missing and unexpected, one line each kind.
void log_init_weights(const InitWeights& init);

/// Where a run's weights came from, in summary.json: a new run from train.init_from writes <run>/init_from.json (the
/// file and its hash) and puts both into `sum`; a resume, which reads no init_from, takes them from that file.
void record_init_weights(const std::string& run_dir, const InitWeights& init, RunSummary& sum);

}  // namespace gt
