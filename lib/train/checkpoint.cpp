// Checkpoint folders: written into a temporary folder, fsync'ed and renamed, so that a crash at any moment leaves
// the previous checkpoint complete; read back with every file's size and CRC-32 checked against state.json.
#include "train/checkpoint.h"
#include "train/checkpoint_format.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/quote.h"
#include "graph/model.h"
#include "io/safetensors.h"
#include "log/logging.h"
#include "optim/optimizer.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

namespace gt {
namespace fs = std::filesystem;
using namespace checkpoint_detail;

namespace checkpoint_detail {

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

uint32_t crc_of(std::string_view text) {
  return static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const unsigned char*>(text.data()), text.size()));
}

// Size and CRC-32 of a file, read in 1 MiB pieces.
FileSum file_sum(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  FileSum s;
  s.crc = static_cast<uint32_t>(crc32_z(0, nullptr, 0));
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(err)));
    }
    if (n == 0) break;
    s.crc = static_cast<uint32_t>(crc32_z(s.crc, buf.data(), static_cast<size_t>(n)));
    s.bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return s;
}

}  // namespace checkpoint_detail

namespace {

// "step-120" → 120; -1 for anything else.
int64_t step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 24) return -1;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(name.data() + 5, name.data() + name.size(), v);
  return ec == std::errc() && end == name.data() + name.size() && v >= 0 ? v : -1;
}

}  // namespace

std::string shard_file_name(int rank, int world) { return fmt::format("optimizer.shard-{}-of-{}.bin", rank, world); }

CheckpointInfo::File write_shard_file(const std::string& path, const std::string& name,
                                      const std::vector<const Tensor*>& pieces) {
  AtomicFile out(path);
  uint32_t crc = static_cast<uint32_t>(crc32_z(0, nullptr, 0));
  uint64_t bytes = 0;
  Tensor staged;  // a device piece's host copy (dist.zero on GPUs), as zero 0's CUDA checkpoints copy their tensors
  for (const Tensor* piece : pieces) {
    GT_CHECK(piece->dtype() == DType::f32, "shard files hold f32 tensors");
    Tensor t = *piece;
    if (!t.device().is_cpu()) {
      if (staged.numel() < t.numel()) staged = Tensor::empty(Shape{t.numel()}, DType::f32);
      t = staged.slice0(0, piece->numel());
      t.copy_from(*piece);  // waits for the device's work on it
    }
    const size_t n = static_cast<size_t>(t.numel()) * 4;
    out.write(t.data<float>(), n);
    crc = static_cast<uint32_t>(crc32_z(crc, reinterpret_cast<const unsigned char*>(t.data<float>()), n));
    bytes += n;
  }
  out.commit();
  return {name, bytes, hex32(crc)};
}

std::string trained_params_hash(Model& model) {
  uint32_t h = fnv1a("");
  for (const auto& [name, p] : model.named_params()) h = fnv1a(name + '\n', h);
  return hex32(h);
}

std::string config_hash(const std::string& resolved_config) { return hex32(crc_of(resolved_config)); }

std::string seal_state_json(const std::string& object) {
  if (object.size() < 2 || object.back() != '}') throw Error("seal_state_json: not a JSON object");
  return object.substr(0, object.size() - 1) + std::string(kStateCrcField) + hex32(crc_of(object)) + "\"}\n";
}

void check_state_checksum(const std::string& text, const std::string& source) {
  const size_t at = text.rfind(kStateCrcField);
  const size_t value = at + kStateCrcField.size();
  if (at == std::string::npos || text.size() != value + 8 + 3 || text.compare(value + 8, 3, "\"}\n") != 0 ||
      text.find_first_not_of("0123456789abcdef", value) != value + 8)
    throw DataError(fmt::format("{}: has no state_crc32 as its last field (damaged or edited by hand)", source));
  const std::string recorded = text.substr(value, 8);
  const std::string got = hex32(crc_of(text.substr(0, at) + "}"));
  if (got != recorded)
    throw DataError(fmt::format("{}: checksum {} does not match the recorded state_crc32 {} (the file is corrupt)",
                                source, got, recorded));
}

CheckpointStore::CheckpointStore(std::string run_dir, CheckpointConfig cfg, int world_size, int64_t batch_size,
                                 int64_t accumulate)
    : m_root((fs::path(run_dir) / "checkpoints").string()),
      m_cfg(std::move(cfg)),
      m_world(world_size),
      m_batch(batch_size),
      m_accumulate(accumulate) {}

std::string CheckpointStore::folder(int64_t step) const {
  return (fs::path(m_root) / fmt::format(".step-{}.tmp", step)).string();
}

std::string CheckpointStore::begin(int64_t step) {
  const fs::path root = m_root, tmp = folder(step);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw Error(fmt::format("{}: cannot create: {}", root.string(), ec.message()));
  fs::remove_all(tmp, ec);  // left by a write that crashed
  fs::create_directory(tmp, ec);
  if (ec) throw Error(fmt::format("{}: cannot create: {}", tmp.string(), ec.message()));
  return tmp.string();
}

void CheckpointStore::abandon(int64_t step) {
  std::error_code ec;
  fs::remove_all(folder(step), ec);
}

std::string CheckpointStore::save(Model& model, Optimizer& optimizer, OptimizerType optimizer_type,
                                  const TrainProgress& p, const std::string& resolved_config) {
  return save(model, optimizer, optimizer_type, p, resolved_config, nullptr);
}

std::string CheckpointStore::save(Model& model, Optimizer& optimizer, OptimizerType optimizer_type,
                                  const TrainProgress& p, const std::string& resolved_config,
                                  const CheckpointInfo::Shards* shards) {
  const fs::path root = m_root;
  const std::string name = fmt::format("step-{}", p.step);
  const fs::path tmp = shards ? fs::path(folder(p.step)) : fs::path(begin(p.step)), final_dir = root / name;
  std::error_code ec;
  try {
    const std::string steps = std::to_string(p.step), type = to_string(optimizer_type);
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (auto& [n, t] : model.state_tensors()) tensors.emplace_back(n, t);
    write_safetensors((tmp / kModelFile).string(), tensors,
                      {{"format", "pt"}, {"gputrain_version", GPUTRAIN_VERSION}, {"step", steps}});
    tensors.clear();
    if (!shards) {
      for (auto& [n, t] : optimizer.state()) tensors.emplace_back(n, t);
      write_safetensors((tmp / kOptimizerFile).string(), tensors,
                        {{"optimizer", type}, {"steps_taken", std::to_string(optimizer.steps_taken())}});
    }
    JsonObject files;
    for (const char* f : {kModelFile, kOptimizerFile}) {
      if (shards && std::string_view(f) == kOptimizerFile) break;
      const FileSum s = file_sum((tmp / f).string());
      files.add(f, JsonObject().add("bytes", static_cast<int64_t>(s.bytes)).add("crc32", hex32(s.crc)));
    }
    JsonObject opt = JsonObject()
                         .add("type", type)
                         .add("steps_taken", optimizer.steps_taken())
                         .add("trained_params", static_cast<int64_t>(model.params().size()))
                         .add("trained_params_fnv1a", trained_params_hash(model));
    if (shards) {
      std::vector<JsonObject> buffers, buckets, shard_files;
      for (const std::string& b : shards->buffers) buffers.push_back(JsonObject().add("name", b));
      for (const auto& b : shards->buckets) {
        std::vector<JsonObject> ps;
        for (size_t k = 0; k < b.params.size(); ++k)
          ps.push_back(JsonObject().add("index", b.params[k]).add("elements", b.sizes[k]));
        buckets.push_back(JsonObject().add("chunk", b.chunk).add("params", ps));
      }
      for (const auto& f : shards->files)
        shard_files.push_back(
            JsonObject().add("name", f.name).add("bytes", static_cast<int64_t>(f.bytes)).add("crc32", f.crc32));
      opt.add("shards", JsonObject()
                            .add("world_size", shards->world_size)
                            .add("stage", shards->stage)
                            .add("buffers", buffers)
                            .add("buckets", buckets)
                            .add("files", shard_files));
    }
    JsonObject state = JsonObject()
                           .add("format", kFormat)
                           .add("format_version", shards ? kShardedFormatVersion : kFormatVersion)
                           .add("gputrain_version", GPUTRAIN_VERSION)
                           .add("world_size", m_world)
                           .add("step", p.step)
                           .add("epoch", p.epoch)
                           .add("position", JsonObject()
                                                .add("micro_batches", p.micro_done)
                                                .add("batch_size", m_batch)
                                                .add("accumulate", m_accumulate))
                           .add("rng", JsonObject()
                                           .add("algorithm", "philox4x32-10")
                                           .add("streams",
                                                "counter-based: data order keyed by (seed, epoch), augmentation by "
                                                "(seed, epoch, position), dropout by (seed, layer, micro-batch)"))
                           .add("scheduler", JsonObject().add("step", p.step).add("lr_scale", p.lr_scale))
                           .add("optimizer", opt)
                           .add("progress", JsonObject()
                                                .add("epochs_done", p.epochs_done)
                                                .add("train_samples", p.train_samples)
                                                .add("epoch_samples", p.epoch_samples)
                                                .add("window_samples", p.window_samples)
                                                .add("epoch_loss", p.epoch_loss)
                                                .add("window_loss", p.window_loss)
                                                .add("window_hits", p.window_hits)
                                                .add("window_loss_carried", p.window_loss_carried)
                                                .add("final_train_loss", p.final_train_loss)
                                                .add("grad_norm", p.grad_norm)
                                                .add("train_seconds", p.train_seconds)
                                                .add("last_eval_step", p.last_eval_step)
                                                .add("skips_in_row", p.skips_in_row))
                           .add("metrics", JsonObject()
                                               .add("test_loss", p.test_loss)
                                               .add("test_accuracy", p.test_accuracy)
                                               .add("best_metric", to_string(m_cfg.keep_best))
                                               .add("best_value", p.best_value)
                                               .add("best_step", p.best_step)
                                               .add("jsonl_bytes", static_cast<int64_t>(p.metrics_bytes)))
                           .add("config_hash", config_hash(resolved_config))
                           .add("config", resolved_config)
                           .add("files", files);
    // The loss scaler's state, so that a resumed fp16 run scales (and skips) as an uninterrupted one; null without.
    if (p.loss_scale > 0)
      state.add("loss_scaler", JsonObject()
                                   .add("scale", p.loss_scale)
                                   .add("growth_tracker", p.scale_growth_tracker)
                                   .add("overflow_skips", p.overflow_skips));
    else
      state.add_null("loss_scaler");
    write_file_atomic((tmp / kStateFile).string(), seal_state_json(state.str()));
    fsync_dir(tmp);
    // A checkpoint of the same step may exist (a resumed or rolled-back run passing it again): swap, then drop it.
    const fs::path old = root / ("." + name + ".old");
    fs::remove_all(old, ec);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_dir(root);
    fs::remove_all(old, ec);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw Error(fmt::format("{}: {}", e.path1().string(), e.code().message()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  write_file_atomic((root / "latest").string(), name + "\n");
  if (m_cfg.keep_best != KeepBest::none && p.best_step == p.step)
    write_file_atomic((root / "best").string(), name + "\n");

  // Prune only now that the new checkpoint is complete: keep the newest `keep`, the best, and the one just written.
  const std::string best =
      m_cfg.keep_best != KeepBest::none && p.best_step >= 0 ? fmt::format("step-{}", p.best_step) : std::string();
  std::vector<std::pair<int64_t, std::string>> all;
  std::vector<fs::path> stale;  // temporaries of writes that crashed
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (const int64_t s = step_of(n); s >= 0 && e.is_directory()) all.emplace_back(s, n);
    if (n.size() > 4 && n[0] == '.' && (n.ends_with(".tmp") || n.ends_with(".old"))) stale.push_back(e.path());
  }
  for (const auto& t : stale) fs::remove_all(t, ec);
  std::sort(all.rbegin(), all.rend());
  int64_t kept = 0;
  for (const auto& [s, n] : all) {  // newest first
    if (kept < m_cfg.keep || n == name) {
      ++kept;
      continue;
    }
    if (n != best) fs::remove_all(root / n, ec);
  }
  return final_dir.string();
}

std::vector<std::string> CheckpointStore::list() const {
  const fs::path root = m_root;
  std::vector<std::pair<int64_t, std::string>> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (const int64_t s = step_of(e.path().filename().string()); s >= 0 && fs::exists(e.path() / kStateFile))
      all.emplace_back(s, (root / e.path().filename()).string());
  std::sort(all.rbegin(), all.rend());
  std::vector<std::string> out;
  std::string latest;
  {
    std::ifstream in(root / "latest");
    std::getline(in, latest);
  }
  for (const auto& [s, dir] : all)
    if (!latest.empty() && fs::path(dir).filename() == latest) out.push_back(dir);
  for (const auto& [s, dir] : all)
    if (out.empty() || dir != out.front()) out.push_back(dir);
  return out;
}

void CheckpointStore::remove_after(int64_t step) {
  std::error_code ec;
  for (const auto& dir : list())
    if (step_of(fs::path(dir).filename().string()) > step) fs::remove_all(dir, ec);
  const std::string name = fmt::format("step-{}", step);
  if (fs::exists(fs::path(m_root) / name)) write_file_atomic((fs::path(m_root) / "latest").string(), name + "\n");
}

std::optional<CheckpointInfo> CheckpointStore::newest_good() const {
  for (const auto& dir : list()) {
    try {
      return read_checkpoint(dir);
    } catch (const Error& e) {
      spdlog::warn("skipping checkpoint {}: {}", dir, e.what());
    }
  }
  return std::nullopt;
}

}  // namespace gt