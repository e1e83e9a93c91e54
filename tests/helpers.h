// Test helpers: running the gputrain binary, temporary folders, reading small JSON fields.
#pragma once

#include "data/dataset.h"
#include "ops/cpu/bf16_gemm.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/sgemm.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gt::test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

/// The gputrain binary the tests run: the build's, or $GT_GPUTRAIN when set.
std::string gputrain_binary();

/// Runs `cmd` through the shell and captures its stdout (the command redirects stderr itself when it wants it).
CommandResult run_shell(const std::string& cmd);

/// Runs `gputrain <args>` through the shell (args are passed as written) and captures its output.
/// `env` ("NAME=value …") is put before the command.
CommandResult run_gputrain(const std::string& args, const std::string& env = "");

/// A fresh empty folder under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return m_path; }
  std::string operator/(const std::string& name) const { return m_path + "/" + name; }

 private:
  std::string m_path;
};

std::string read_text(const std::string& path);
/// The non-empty lines of `text`.
std::vector<std::string> lines_of(const std::string& text);
void write_text(const std::string& path, const std::string& text);
/// The number stored under "key" in a one-line JSON object; nullopt when absent or null.
std::optional<double> json_number(const std::string& json, const std::string& key);
/// The "loss" of every train row of a metrics.jsonl text, in order.
std::vector<double> train_losses(const std::string& metrics);
/// The string stored under "key".
std::optional<std::string> json_string(const std::string& json, const std::string& key);
/// An NPY v1.0 file (`descr` like "<f4", `shape` like "(3, 2)") holding `bytes` of raw data.
void write_npy(const std::string& path, const std::string& descr, const std::string& shape, const void* data,
               size_t bytes);

/// A gputrain process running in the background, its output going to a file.
struct Background {
  int pid = -1;
  std::string log;
};
Background start_gputrain(const std::string& args, const std::string& log_path, const std::string& env = "");
/// Waits for it to end; its exit code (128 + signal when killed).
int wait_exit(const Background& b);
/// Waits until `path` exists (or `seconds` pass); false on time-out.
bool wait_for_file(const std::string& path, double seconds);

/// Path of a file in the source tree (configs/…).
std::string source_path(const std::string& rel);

/// The model section (`layers:` …) of configs/gpt_bytes.yaml's GPT-2 layout at test sizes: a token table of `vocab`
/// rows and `dim` channels, positions up to `len`, `blocks` pre-norm blocks of `heads`-head attention and a GELU MLP
/// of `hidden`, and a head tied to the token table.
/// max over the tensors k of max_i |a[k][i] − b[k][i]| / max_i |b[k][i]|: each gradient tensor against its own
/// scale, so that no tensor's scale hides another's error (a tensor of zeros in b counts its absolute difference 0).
double worst_relative_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b);

std::string gpt_layers(int64_t vocab, int64_t dim, int64_t len, int64_t blocks, int64_t heads, int64_t hidden);
/// A whole config of that GPT on `device`, token data that need not exist (none/train_*.bin: sized, not loaded),
/// windows of `len` in batches of `batch`, AdamW.
std::string gpt_config(const std::string& device, int64_t vocab, int64_t dim, int64_t len, int64_t blocks,
                       int64_t heads, int64_t hidden, int64_t batch);

/// Declares warnings a test expects. The suite's main installs a log sink that fails the running test for every
/// warning or error logged in this process (by any thread) that no live ExpectWarnings matches; within its scope,
/// those whose message contains `substring` are allowed instead, and at least one of them must come, or the test
/// fails when the guard goes away. Guards nest; the innermost that matches counts the message.
class ExpectWarnings {
 public:
  explicit ExpectWarnings(std::string substring);
  ~ExpectWarnings();
  ExpectWarnings(const ExpectWarnings&) = delete;
  ExpectWarnings& operator=(const ExpectWarnings&) = delete;
  /// Matching warnings so far.
  int count() const;

 private:
  std::string m_substring;
};

/// A synthetic classification problem and the MLP that learns it, for experiment files: `samples` of `features`
/// inputs (and `test_samples` to test on, none when 0) in `classes` classes, batches of `batch`, one relu hidden layer
/// of `hidden`.
struct SyntheticMlp {
  int64_t samples = 0, test_samples = 0, features = 0, classes = 0, batch = 0, hidden = 0;
};
/// Its `data:` section, in the block style experiment files use.
std::string synthetic_data(const SyntheticMlp& s);
/// Its `data:` and `model:` sections and `loss: cross_entropy`: what an experiment file holds between its name, seed
/// and device and its optimizer and train sections.
std::string synthetic_mlp(const SyntheticMlp& s);

/// The fastest experiment file that has a test set: 8 steps an epoch of a 195-parameter MLP on synthetic data.
extern const char* const kTinyConfig;

/// Makes the process's bf16 products take `path` (ops/cpu/bf16_gemm.h; native only where the CPU has it) while it
/// lives, then returns them to the environment's choice.
class ForcedBf16Path {
 public:
  explicit ForcedBf16Path(cpu::CpuBf16Path path) { cpu::force_cpu_bf16_path(path); }
  ~ForcedBf16Path() { cpu::reset_cpu_bf16_path(); }
  ForcedBf16Path(const ForcedBf16Path&) = delete;
  ForcedBf16Path& operator=(const ForcedBf16Path&) = delete;
};

/// Makes the process's f32 products take `path` (ops/cpu/sgemm.h; where the CPU runs it) while it lives, then returns
/// them to the environment's choice.
class ForcedSgemmPath {
 public:
  explicit ForcedSgemmPath(cpu::CpuSgemmPath path) { cpu::force_cpu_sgemm_path(path); }
  ~ForcedSgemmPath() { cpu::reset_cpu_sgemm_path(); }
  ForcedSgemmPath(const ForcedSgemmPath&) = delete;
  ForcedSgemmPath& operator=(const ForcedSgemmPath&) = delete;
};

/// Makes the CPU's convolutions take `algo` where it applies (ops/cpu/conv_algo.h) while it lives.
class ForcedConvAlgo {
 public:
  explicit ForcedConvAlgo(cpu::CpuConvAlgo algo) { cpu::force_cpu_conv_algo(algo); }
  ~ForcedConvAlgo() { cpu::force_cpu_conv_algo(std::nullopt); }
  ForcedConvAlgo(const ForcedConvAlgo&) = delete;
  ForcedConvAlgo& operator=(const ForcedConvAlgo&) = delete;
};

/// Makes the CPU kernels' loops take `isa` (ops/cpu/isa.h) while it lives, if this CPU runs it (ok() says whether
/// it took), then returns them to the environment's choice.
class ForcedCpuIsa {
 public:
  explicit ForcedCpuIsa(cpu::CpuIsa isa) : m_ok(cpu::force_cpu_isa(isa)) {}
  ~ForcedCpuIsa() { cpu::force_cpu_isa(std::nullopt); }
  ForcedCpuIsa(const ForcedCpuIsa&) = delete;
  ForcedCpuIsa& operator=(const ForcedCpuIsa&) = delete;
  bool ok() const { return m_ok; }

 private:
  bool m_ok;
};

/// A run's metrics.jsonl without the fields that are measurements rather than training state (samples_per_sec,
/// data_wait_ms, elapsed_s, device_*, host_*, gpu<i>_*), which differ from run to run.
std::string metrics_without_timing(const std::string& run);

/// How many elements of a and b (the same length) differ in their bits: 0 when a product or kernel promises the same
/// bits on two paths.
int bit_differences(const std::vector<float>& a, const std::vector<float>& b);

/// `samples` synthetic 1x6x6 images of 3 classes (seed 5, the training split): small enough for a loader's batches
/// to be compared byte for byte.
Dataset synthetic_images(int64_t samples);

/// The first `n` rows of a batch as bytes, inputs `x` then targets `y`: two batches are the same when these are.
std::string batch_bytes(const Tensor& x, const Tensor& y, int64_t n);

/// For tests/main.cpp: adds the sink to spdlog's default logger, once.
void install_warning_sink();
/// For tests/main.cpp: takes the unexpected warnings logged since the last call ("warn: …" or "error: …").
std::vector<std::string> take_unexpected_warnings();

}  // namespace gt::test
