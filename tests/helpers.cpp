// Test helpers: process runner, temp dirs, tiny JSON field readers, the expected-warning guard.
#include "helpers.h"

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace gt::test {

std::string gputrain_binary() {
  // GT_GPUTRAIN overrides the build's path: scripts/gpu_check.sh runs the tests from an unpacked bundle elsewhere.
  const char* over = std::getenv("GT_GPUTRAIN");
  return over && *over ? over : GT_BINARY;
}

CommandResult run_gputrain(const std::string& args, const std::string& env) {
  return run_shell((env.empty() ? "" : env + " ") + gputrain_binary() + " " + args + " 2>&1");
}

CommandResult run_shell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  CommandResult r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// An NPY v1.0 file: magic, header dict padded to 64 bytes, raw little-endian data.
void write_npy(const std::string& path, const std::string& descr, const std::string& shape, const void* data,
               size_t bytes) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(data), bytes);
  write_text(path, out);
}

Background start_gputrain(const std::string& args, const std::string& log_path, const std::string& env) {
  // The shell's exec replaces it, so the pid is gputrain's own and signals reach it directly.
  const std::string cmd =
      (env.empty() ? "" : env + " ") + "exec " + gputrain_binary() + " " + args + " > " + log_path + " 2>&1";
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return {pid, log_path};
}

int wait_exit(const Background& b) {
  int status = 0;
  if (waitpid(b.pid, &status, 0) != b.pid) throw std::runtime_error("waitpid failed");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string metrics_without_timing(const std::string& run) {
  static const std::regex timing(
      R"re(, "(samples_per_sec|data_wait_ms|train_s|eval_s|checkpoint_s|elapsed_s|device_[a-z_]+|host_[a-z_]+|gpu[0-9]+_[a-z_]+)": ("[^"]*"|[^,}]*))re");
  return std::regex_replace(read_text(run + "/metrics.jsonl"), timing, "");
}

bool wait_for_file(const std::string& path, double seconds) {
  for (int i = 0; i < static_cast<int>(seconds * 100); ++i) {
    if (std::filesystem::exists(path)) return true;
    usleep(10000);
  }
  return std::filesystem::exists(path);
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gputrain-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  m_path = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(m_path, ec);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::vector<double> train_losses(const std::string& metrics) {
  std::vector<double> out;
  for (const auto& l : lines_of(metrics))
    if (l.find("\"type\": \"train\"") != std::string::npos)
      if (auto v = json_number(l, "loss")) out.push_back(*v);
  return out;
}

std::optional<double> json_number(const std::string& json, const std::string& key) {
  const std::regex re("\"" + key + "\": (-?[0-9][0-9.eE+-]*)");
  std::smatch m;
  if (!std::regex_search(json, m, re)) return std::nullopt;
  return std::stod(m[1].str());
}

std::optional<std::string> json_string(const std::string& json, const std::string& key) {
  const std::regex re("\"" + key + "\": \"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(json, m, re)) return std::nullopt;
  return m[1].str();
}

std::string source_path(const std::string& rel) { return std::string(GT_SOURCE_DIR) + "/" + rel; }

namespace {

// The live guards (innermost last) with their counts, and the warnings none of them matched. Guarded by g_warn_mutex:
// worker and sampler threads log too.
struct Guard {
  const ExpectWarnings* owner;
  std::string substring;
  int count = 0;
};
std::mutex g_warn_mutex;
std::vector<Guard> g_guards;
std::vector<std::string> g_unexpected;

class WarningSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn || msg.level == spdlog::level::off) return;
    const std::string text(msg.payload.data(), msg.payload.size());
    std::lock_guard lock(g_warn_mutex);
    for (auto it = g_guards.rbegin(); it != g_guards.rend(); ++it)
      if (text.find(it->substring) != std::string::npos) {
        ++it->count;
        return;
      }
    const auto level = spdlog::level::to_string_view(msg.level);
    g_unexpected.push_back(std::string(level.data(), level.size()) + ": " + text);
  }
  void flush_() override {}
};

}  // namespace

ExpectWarnings::ExpectWarnings(std::string substring) : m_substring(std::move(substring)) {
  std::lock_guard lock(g_warn_mutex);
  g_guards.push_back({this, m_substring});
}

double worst_relative_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a[k].size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[k][i]) - b[k][i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[k][i])));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

std::string gpt_layers(int64_t vocab, int64_t dim, int64_t len, int64_t blocks, int64_t heads, int64_t hidden) {
  std::ostringstream out;
  out << "layers:\n"
      << "  - {type: embedding, name: wte, num_embeddings: " << vocab << ", embedding_dim: " << dim << "}\n"
      << "  - {type: positional_embedding, name: wpe, max_len: " << len << "}\n"
      << "  - repeat: " << blocks << "\n    name: h\n    layers:\n"
      << "      - {type: layernorm, name: ln_1}\n"
      << "      - {type: causal_self_attention, name: attn, heads: " << heads << "}\n"
      << "      - {type: add, name: res_1, inputs: [input, attn]}\n"
      << "      - {type: layernorm, name: ln_2}\n"
      << "      - {type: linear, name: fc, out_features: " << hidden << "}\n"
      << "      - {type: gelu, approximate: tanh}\n"
      << "      - {type: linear, name: proj, out_features: " << dim << "}\n"
      << "      - {type: add, inputs: [res_1, proj]}\n"
      << "  - {type: layernorm, name: ln_f}\n"
      << "  - {type: linear, name: lm_head, out_features: " << vocab << ", tied_to: wte, bias: false}\n";
  return out.str();
}

std::string gpt_config(const std::string& device, int64_t vocab, int64_t dim, int64_t len, int64_t blocks,
                       int64_t heads, int64_t hidden, int64_t batch) {
  std::string layers;
  std::istringstream in(gpt_layers(vocab, dim, len, blocks, heads, hidden));
  for (std::string line; std::getline(in, line);) layers += "  " + line + "\n";
  return fmt::format(
      "name: gpt\nseed: 1\ndevice: {}\ndata: {{format: tokens, train: {{path: none/train_*.bin}}, "
      "block_size: {}, batch_size: {}}}\nmodel:\n{}optimizer: {{type: adamw, lr: 0.001}}\n",
      device, len, batch, layers);
}

ExpectWarnings::~ExpectWarnings() {
  int n = 0;
  {
    std::lock_guard lock(g_warn_mutex);
    const auto it = std::find_if(g_guards.begin(), g_guards.end(), [&](const Guard& g) { return g.owner == this; });
    n = it->count;
    g_guards.erase(it);
  }
  // A test already leaving by an exception has failed; "no warning came" would only hide why.
  if (n == 0 && std::uncaught_exceptions() == 0)
    FAIL_CHECK("expected a warning containing \"" << m_substring << "\", but none was logged");
}

int ExpectWarnings::count() const {
  std::lock_guard lock(g_warn_mutex);
  for (const Guard& g : g_guards)
    if (g.owner == this) return g.count;
  return 0;
}

void install_warning_sink() {
  static const bool installed = [] {
    spdlog::default_logger()->sinks().push_back(std::make_shared<WarningSink>());
    return true;
  }();
  (void)installed;
}

std::vector<std::string> take_unexpected_warnings() {
  std::lock_guard lock(g_warn_mutex);
  return std::exchange(g_unexpected, {});
}

std::string synthetic_data(const SyntheticMlp& s) {
  return fmt::format(
      "data:\n  format: synthetic\n  samples: {}\n{}  input_shape: [{}]\n  targets: {{classes: {}}}\n"
      "  batch_size: {}\n",
      s.samples, s.test_samples > 0 ? fmt::format("  test_samples: {}\n", s.test_samples) : "", s.features, s.classes,
      s.batch);
}

std::string synthetic_mlp(const SyntheticMlp& s) {
  return synthetic_data(s) + fmt::format(R"(model:
  layers:
    - {{type: linear, out_features: {}}}
    - relu
    - {{type: linear, out_features: {}}}
loss: cross_entropy
)",
                                         s.hidden, s.classes);
}

const char* const kTinyConfig = R"(name: tiny
seed: 3
device: cpu
data:
  format: synthetic
  samples: 256
  test_samples: 64
  input_shape: [8]
  targets: {classes: 3}
  batch_size: 32
model:
  layers:
    - {type: linear, out_features: 16}
    - relu
    - {type: linear, out_features: 3}
loss: cross_entropy
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 1, log_every: 1}
)";

Dataset synthetic_images(int64_t samples) {
  SyntheticSpec spec;
  spec.samples = samples;
  spec.input_shape = {1, 6, 6};
  spec.classes = 3;
  return make_synthetic(spec, 5, 0);
}

std::string batch_bytes(const Tensor& x, const Tensor& y, int64_t n) {
  std::string b(static_cast<const char*>(x.raw()), x.narrow0(n).bytes());
  return b.append(static_cast<const char*>(y.raw()), y.narrow0(n).bytes());
}

int bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  int differ = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    differ += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  return differ + static_cast<int>(std::max(a.size(), b.size()) - std::min(a.size(), b.size()));
}

}  // namespace gt::test
