// Fuzz target: output ownership and run-directory resolution — what owns a path (core/ownership.h: `report --out`,
// `export --to` refuse other commands' outputs; `train --out` a folder it may not take) and which weights
// `eval --checkpoint PATH` reads — over a fixed tree with a run directory and a tokenization in it. The input is a
// path inside that tree (`..` may leave it); anything refused must be a gt::Error, and nothing is written.
#include "core/error.h"
#include "core/ownership.h"
#include "train/resume.h"
#include "train/run_dir.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

// runs/r: a run directory with one checkpoint (its files need not verify), plus loose weights beside it.
class Tree {
 public:
  Tree() {
    const char* env = std::getenv("TMPDIR");
    const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : env && *env ? env : "/tmp";
    m_root = dir + "/gt_fuzz_" + std::to_string(::getpid()) + "_run_dir";
    const fs::path run = fs::path(m_root) / "runs/r";
    fs::create_directories(run / "checkpoints/step-1");
    fs::create_directories(fs::path(m_root) / "loose");
    for (const char* f : {"config.resolved.yaml", "metrics.jsonl", "summary.json", "model.safetensors",
                          "checkpoints/latest", "checkpoints/step-1/state.json", "checkpoints/step-1/model.safetensors",
                          "checkpoints/step-1/optimizer.safetensors"})
      std::ofstream(run / f) << "x";
    std::ofstream(fs::path(m_root) / "loose/w.safetensors") << "x";
    fs::create_directories(fs::path(m_root) / "tok");
    std::ofstream(fs::path(m_root) / "tok/train_000000.bin") << "x";
    gt::write_manifest((fs::path(m_root) / "tok").string(), gt::Owner::tokenization, {"train_000000.bin"}, true);
  }
  ~Tree() {
    std::error_code ec;
    fs::remove_all(m_root, ec);
  }
  const std::string& root() const { return m_root; }

 private:
  std::string m_root;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tree tree;
  const std::string input(reinterpret_cast<const char*>(data), size);
  if (input.find('\0') != std::string::npos || size > 4096) return 0;  // not a path a shell can pass
  const std::string path = tree.root() + "/" + input;
  (void)gt::folder_ownership(path);
  (void)gt::holds_run_files(path);
  try {
    gt::refuse_output_file("--out", path, {tree.root() + "/loose/w.safetensors"}, {"report.html"});
  } catch (const gt::Error&) {
  }
  for (const gt::Owner owner : {gt::Owner::run, gt::Owner::sweep, gt::Owner::tokenization, gt::Owner::import}) {
    try {
      (void)gt::check_output_folder("--out", path, owner, gt::Reuse::replace);  // checks only: writes nothing
    } catch (const gt::Error&) {
    }
  }
  try {
    (void)gt::weights_file(path, gt::CheckpointConfig{});
  } catch (const gt::Error&) {
  }
  return 0;
}
