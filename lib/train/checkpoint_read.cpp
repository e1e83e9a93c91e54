// Reading a checkpoint back: state.json parsed and every file's size and CRC-32 checked against it, then the
// tensors copied into the model and the optimizer (whole files, or the byte ranges of optimizer shards).
#include "train/checkpoint.h"
#include "train/checkpoint_format.h"

#include "core/error.h"
#include "core/json.h"
#include "core/json_read.h"
#include "graph/model.h"
#include "io/safetensors.h"
#include "log/logging.h"
#include "optim/optimizer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>

namespace gt {
namespace fs = std::filesystem;
using namespace checkpoint_detail;

namespace {

std::string read_small_file(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > limit) throw DataError(fmt::format("{}: larger than {} bytes, not a state file", path, limit));
  }
  return text;
}

// Typed reads of state.json fields; every failure names the file and the field.
class StateReader {
 public:
  StateReader(const JsonValue& root, std::string source) : m_root(root), m_source(std::move(source)) {}

  // nullptr when absent and not required.
  const JsonValue* node(const std::string& path, bool required = true) const {
    const JsonValue* n = &m_root;
    size_t begin = 0;
    while (begin <= path.size()) {
      const size_t dot = path.find('/', begin);  // '/' separates: file names hold dots
      const std::string key = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
      n = n->find(key);
      if (!n) {
        if (required) fail(path, "is missing");
        return nullptr;
      }
      if (dot == std::string::npos) break;
      begin = dot + 1;
    }
    return n;
  }
  std::string str(const std::string& path) const {
    const JsonValue* n = node(path);
    if (!n->is_string()) fail(path, fmt::format("expected a string, got {}", n->text()));
    return n->string;
  }
  int64_t integer(const std::string& path, int64_t min = 0) const {
    const JsonValue* n = node(path);
    if (!n->integer || *n->integer < min) fail(path, fmt::format("expected an integer ≥ {}, got {}", min, n->text()));
    return *n->integer;
  }
  double number(const std::string& path) const {
    const JsonValue* n = node(path);
    if (!n->is_number() || !std::isfinite(n->number))
      fail(path, fmt::format("expected a finite number, got {}", n->text()));
    return n->number;
  }
  std::optional<double> optional_number(const std::string& path) const {
    const JsonValue* n = node(path, false);
    if (!n || n->is_null()) return std::nullopt;
    return number(path);
  }
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw DataError(fmt::format("{}: field {} {}", m_source, path, what));
  }

 private:
  const JsonValue& m_root;
  std::string m_source;
};

std::string crc_of_field(const StateReader& r, const JsonValue* node, const std::string& path) {
  const std::string crc = node->is_string() ? node->string : "";
  if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
    r.fail(path, fmt::format("expected 8 hex digits, got {}", node->text()));
  return crc;
}

const std::vector<JsonValue>& array_of(const StateReader& r, const JsonValue& parent, const std::string& key,
                                       const std::string& path) {
  const JsonValue* n = parent.find(key);
  if (!n || !n->is_array()) r.fail(path + "/" + key, "is missing or not a list");
  return n->items;
}

int64_t integer_of(const StateReader& r, const JsonValue& parent, const std::string& key, const std::string& path,
                   int64_t min) {
  const JsonValue* n = parent.find(key);
  if (!n || !n->integer || *n->integer < min)
    r.fail(path + "/" + key, fmt::format("expected an integer ≥ {}, got {}", min, n ? n->text() : "nothing"));
  return *n->integer;
}

// optimizer.shards: the world size and stage that wrote the shards, how the flat state was cut (the buckets, the
// chunk of each per rank, the buffers) and each shard file's name, size and CRC-32.
CheckpointInfo::Shards parse_shards(const StateReader& r) {
  CheckpointInfo::Shards s;
  const std::string at = "optimizer/shards";
  const JsonValue& root = *r.node(at);
  s.world_size = r.integer(at + "/world_size", 1);
  s.stage = r.integer(at + "/stage", 1);
  for (const JsonValue& b : array_of(r, root, "buffers", at)) {
    const JsonValue* name = b.find("name");
    if (!name || !name->is_string() || name->string.empty()) r.fail(at + "/buffers", "holds an entry without a name");
    s.buffers.push_back(name->string);
  }
  for (const JsonValue& b : array_of(r, root, "buckets", at)) {
    CheckpointInfo::Shards::Bucket bucket;
    const std::string bat = at + "/buckets";
    bucket.chunk = integer_of(r, b, "chunk", bat, 0);
    int64_t n = 0;
    for (const JsonValue& p : array_of(r, b, "params", bat)) {
      bucket.params.push_back(integer_of(r, p, "index", bat + "/params", 0));
      bucket.sizes.push_back(integer_of(r, p, "elements", bat + "/params", 0));
      n += bucket.sizes.back();
    }
    if (bucket.chunk * s.world_size < n)
      r.fail(bat, fmt::format("holds a bucket of {} elements in {} chunks of {}", n, s.world_size, bucket.chunk));
    s.buckets.push_back(std::move(bucket));
  }
  const auto& files = array_of(r, root, "files", at);
  if (static_cast<int64_t>(files.size()) != s.world_size)
    r.fail(at + "/files", fmt::format("lists {} shard files for world_size {}", files.size(), s.world_size));
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string fat = fmt::format("{}/files/{}", at, i);
    const JsonValue* name = files[i].find("name");
    if (!name || name->string != shard_file_name(static_cast<int>(i), static_cast<int>(s.world_size)))
      r.fail(fat + "/name",
             fmt::format("expected \"{}\"", shard_file_name(static_cast<int>(i), static_cast<int>(s.world_size))));
    const JsonValue* crc = files[i].find("crc32");
    if (!crc) r.fail(fat + "/crc32", "is missing");
    s.files.push_back({name->string, static_cast<uint64_t>(integer_of(r, files[i], "bytes", fat, 0)),
                       crc_of_field(r, crc, fat + "/crc32")});
  }
  return s;
}

}  // namespace

CheckpointInfo parse_state_json(const std::string& text, const std::string& source) {
  JsonValue root;
  try {
    root = json_read_object(text, JsonLimits{kStateLimit, 16});
  } catch (const JsonReadError& e) {
    if (e.reason() == JsonReadError::Reason::not_object) throw DataError(fmt::format("{}: {}", source, e.what()));
    throw DataError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  const StateReader r(root, source);
  if (r.str("format") != kFormat) r.fail("format", fmt::format("expected \"{}\"", kFormat));
  const int64_t version = r.integer("format_version");
  if (version != kFormatVersion && version != kShardedFormatVersion)
    r.fail("format_version", fmt::format("is {}; this gputrain reads versions {} and {}", version, kFormatVersion,
                                         kShardedFormatVersion));
  CheckpointInfo c;
  c.gputrain_version = r.str("gputrain_version");
  c.world_size = r.integer("world_size", 1);
  c.config_hash = r.str("config_hash");
  c.config = r.str("config");
  c.optimizer_type = r.str("optimizer/type");
  if (r.node("optimizer/trained_params", false)) {  // written since 2026-12-05
    c.trained_params = r.integer("optimizer/trained_params");
    c.trained_params_fnv1a = r.str("optimizer/trained_params_fnv1a");
  }
  TrainProgress& p = c.progress;
  p.step = r.integer("step");
  p.epoch = r.integer("epoch");
  p.micro_done = r.integer("position/micro_batches");
  c.batch_size = r.integer("position/batch_size", 1);
  c.accumulate = r.integer("position/accumulate", 1);
  p.optimizer_steps = r.integer("optimizer/steps_taken");
  p.lr_scale = r.number("scheduler/lr_scale");
  p.epochs_done = r.integer("progress/epochs_done");
  p.train_samples = r.integer("progress/train_samples");
  p.epoch_samples = r.integer("progress/epoch_samples");
  p.window_samples = r.integer("progress/window_samples");
  p.epoch_loss = r.number("progress/epoch_loss");
  p.window_loss = r.number("progress/window_loss");
  p.window_hits = r.number("progress/window_hits");
  p.window_loss_carried = r.optional_number("progress/window_loss_carried").value_or(0);  // absent before 2026-12-04
  p.final_train_loss = r.number("progress/final_train_loss");
  p.grad_norm = r.number("progress/grad_norm");
  p.train_seconds = r.number("progress/train_seconds");
  p.last_eval_step = r.integer("progress/last_eval_step", -1);
  p.skips_in_row = r.integer("progress/skips_in_row");
  if (const JsonValue* ls = r.node("loss_scaler", false); ls && !ls->is_null()) {
    p.loss_scale = r.number("loss_scaler/scale");
    p.scale_growth_tracker = r.integer("loss_scaler/growth_tracker");
    p.overflow_skips = r.integer("loss_scaler/overflow_skips");
  }
  p.test_loss = r.optional_number("metrics/test_loss");
  p.test_accuracy = r.optional_number("metrics/test_accuracy");
  p.best_value = r.optional_number("metrics/best_value");
  p.best_step = r.integer("metrics/best_step", -1);
  p.metrics_bytes = static_cast<uint64_t>(r.integer("metrics/jsonl_bytes"));
  if (version == kShardedFormatVersion) c.shards = parse_shards(r);
  for (const char* file : {kModelFile, kOptimizerFile}) {
    if (c.shards && std::string_view(file) == kOptimizerFile) break;
    const int64_t bytes = r.integer(fmt::format("files/{}/bytes", file));
    const std::string crc_path = fmt::format("files/{}/crc32", file);
    c.files.push_back({file, static_cast<uint64_t>(bytes), crc_of_field(r, r.node(crc_path), crc_path)});
  }
  if (c.shards) c.files.insert(c.files.end(), c.shards->files.begin(), c.shards->files.end());
  return c;
}

CheckpointInfo read_checkpoint(const std::string& dir) {
  const std::string state_path = (fs::path(dir) / kStateFile).string();
  const std::string text = read_small_file(state_path, kStateLimit);
  CheckpointInfo c = parse_state_json(text, state_path);  // first: a newer format is named as such
  check_state_checksum(text, state_path);
  c.dir = dir;
  for (const CheckpointInfo::File& f : c.files) {
    const std::string path = (fs::path(dir) / f.name).string();
    const FileSum got = file_sum(path);
    if (got.bytes != f.bytes)
      throw DataError(fmt::format("{}: {} bytes, but the checkpoint recorded {} (truncated or replaced)", path,
                                  got.bytes, f.bytes));
    if (hex32(got.crc) != f.crc32)
      throw DataError(fmt::format("{}: checksum {} does not match the recorded {} (the file is corrupt)", path,
                                  hex32(got.crc), f.crc32));
  }
  return c;
}

namespace {

// The first NaN or Inf of a float tensor on the host, and how many there are: "holds 2 non-finite values, the first
// nan at [1, 0]"; "" when every value is finite (or the tensor holds integers).
template <class T>
std::string non_finite_values(const Tensor& t) {
  const T* v = t.data<T>();
  const int64_t n = t.numel();
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) {
      if (first < 0) first = i;
      ++count;
    }
  if (count == 0) return "";
  std::string index;  // the flat position as one index per dimension, the last one varying fastest
  for (size_t d = t.rank(), rest = static_cast<size_t>(first); d-- > 0;) {
    index = std::to_string(rest % static_cast<size_t>(t.dim(d))) + (index.empty() ? "" : ", ") + index;
    rest /= static_cast<size_t>(t.dim(d));
  }
  return fmt::format("holds {} non-finite value{}, the first {} at [{}]", count, count == 1 ? "" : "s",
                     static_cast<double>(v[first]), index);
}

}  // namespace

void load_named_tensors(const std::vector<std::pair<std::string, Tensor*>>& wanted, const std::string& path,
                        bool finite_only) {
  const auto file = read_safetensors(path);
  std::map<std::string, const Tensor*> in_file;
  for (const auto& [name, t] : file) in_file[name] = &t;
  std::vector<std::string> problems;
  std::vector<const Tensor*> sources;
  for (const auto& [name, t] : wanted) {
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      problems.push_back(name + ": missing from the file");
      continue;
    }
    if (it->second->shape() != t->shape() || it->second->dtype() != t->dtype())
      problems.push_back(fmt::format("{}: {} {} in the file, {} {} in the model", name, dtype_name(it->second->dtype()),
                                     it->second->shape().str(), dtype_name(t->dtype()), t->shape().str()));
    sources.push_back(it->second);
    in_file.erase(it);
  }
  for (const auto& [name, t] : in_file) problems.push_back(name + ": in the file but not in the model");
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 20; ++i) list += "; " + problems[i];
    throw DataError(fmt::format("{}: does not match the model ({} difference{}){}{}", path, problems.size(),
                                problems.size() == 1 ? "" : "s", list, problems.size() > 20 ? "; …" : ""));
  }
  for (size_t i = 0; finite_only && i < wanted.size(); ++i) {
    const Tensor& t = *sources[i];
    const std::string bad = t.dtype() == DType::f32   ? non_finite_values<float>(t)
                            : t.dtype() == DType::f64 ? non_finite_values<double>(t)
                                                      : std::string();
    if (!bad.empty())
      throw DataError(fmt::format("{}: tensor \"{}\" {} {}: weights of a diverged run, or a corrupt file?", path,
                                  wanted[i].first, t.shape().str(), bad));
  }
  for (size_t i = 0; i < wanted.size(); ++i) wanted[i].second->copy_from(*sources[i]);
}

namespace {

// The shard files of one checkpoint, opened as they are first needed, read with pread.
class ShardReader {
 public:
  ShardReader(const CheckpointInfo& ckpt) : m_ckpt(ckpt), m_fds(ckpt.shards->files.size(), -1) {}
  ~ShardReader() {
    for (int fd : m_fds)
      if (fd >= 0) ::close(fd);
  }
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  void read(size_t shard, uint64_t offset, void* dst, size_t bytes) {
    const CheckpointInfo::File& f = m_ckpt.shards->files[shard];
    const std::string path = (fs::path(m_ckpt.dir) / f.name).string();
    if (offset + bytes > f.bytes)  // the manifest and its own cut disagree: a state.json written by something else
      throw DataError(
          fmt::format("{}: bytes {}..{} are past its recorded size {}", path, offset, offset + bytes, f.bytes));
    int& fd = m_fds[shard];
    if (fd < 0) {
      fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    auto* out = static_cast<char*>(dst);
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
      if (n == 0)
        throw DataError(fmt::format("{}: ends at byte {}, but the checkpoint recorded {} bytes (truncated)", path,
                                    offset + done, f.bytes));
      done += static_cast<size_t>(n);
    }
  }

 private:
  const CheckpointInfo& m_ckpt;
  std::vector<int> m_fds;
};

}  // namespace

void load_state_ranges(const CheckpointInfo& ckpt, const std::vector<StateRange>& ranges,
                       const std::vector<int64_t>& param_sizes) {
  const CheckpointInfo::Shards& s = *ckpt.shards;
  const std::string source = (fs::path(ckpt.dir) / kStateFile).string();
  // Where each parameter lies in the writer's buckets; the writer's parameters must be this model's.
  struct Where {
    size_t bucket = 0;
    int64_t offset = -1;  // within the bucket
  };
  std::vector<Where> where(param_sizes.size());
  std::vector<std::string> problems;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    int64_t offset = 0;
    for (size_t k = 0; k < s.buckets[b].params.size(); ++k) {
      const auto i = static_cast<size_t>(s.buckets[b].params[k]);
      const int64_t n = s.buckets[b].sizes[k];
      if (i >= param_sizes.size())
        problems.push_back(fmt::format("parameter {}: in the checkpoint but not in the model", i));
      else if (where[i].offset >= 0)
        problems.push_back(fmt::format("parameter {}: in two buckets", i));
      else if (n != param_sizes[i])
        problems.push_back(
            fmt::format("parameter {}: {} elements in the checkpoint, {} in the model", i, n, param_sizes[i]));
      else
        where[i] = {b, offset};
      offset += n;
    }
  }
  for (size_t i = 0; i < where.size(); ++i)
    if (where[i].offset < 0 && problems.size() < 20)
      problems.push_back(fmt::format("parameter {}: missing from the checkpoint", i));
  std::map<std::string, size_t> buffer_index;
  for (size_t u = 0; u < s.buffers.size(); ++u) buffer_index[s.buffers[u]] = u;
  for (const StateRange& r : ranges) {
    if (!buffer_index.count(r.buffer))
      problems.push_back(fmt::format("buffer {}: asked for by the optimizer, not in the checkpoint", r.buffer));
    if (r.dst.dtype() != DType::f32)
      problems.push_back(fmt::format("parameter {} {}: {} in the optimizer, f32 in the checkpoint", r.param, r.buffer,
                                     dtype_name(r.dst.dtype())));
  }
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 20; ++i) list += "; " + problems[i];
    throw DataError(fmt::format("{}: the optimizer shards do not match the model ({} difference{}){}", source,
                                problems.size(), problems.size() == 1 ? "" : "s", list));
  }
  // Shard r holds, for bucket after bucket, each buffer's count(r, b) elements: base[r][b] is where bucket b starts.
  const size_t world = s.files.size(), buffers = s.buffers.size();
  auto count = [&](size_t r, size_t b) {
    int64_t n = 0;
    for (int64_t e : s.buckets[b].sizes) n += e;
    const int64_t lo = static_cast<int64_t>(r) * s.buckets[b].chunk;
    return std::clamp<int64_t>(n - lo, 0, s.buckets[b].chunk);
  };
  std::vector<std::vector<uint64_t>> base(world, std::vector<uint64_t>(s.buckets.size() + 1, 0));
  for (size_t r = 0; r < world; ++r)
    for (size_t b = 0; b < s.buckets.size(); ++b)
      base[r][b + 1] = base[r][b] + static_cast<uint64_t>(count(r, b)) * buffers * 4;
  ShardReader reader(ckpt);
  for (const StateRange& r : ranges) {
    const Where& w = where[r.param];
    const int64_t chunk = s.buckets[w.bucket].chunk;
    const size_t u = buffer_index.at(r.buffer);
    Tensor host = r.dst.device().is_cpu() ? r.dst : Tensor::empty(Shape{r.dst.numel()}, DType::f32);
    auto* out = host.data<float>();
    // Elements [pos, end) of the bucket; each old chunk they cross is one read from that rank's shard.
    int64_t pos = w.offset + r.offset;
    const int64_t end = pos + r.dst.numel();
    while (pos < end) {
      const auto shard = static_cast<size_t>(pos / chunk);
      const int64_t take = std::min(end, (static_cast<int64_t>(shard) + 1) * chunk) - pos;
      const uint64_t at =
          base[shard][w.bucket] + (static_cast<uint64_t>(u * static_cast<size_t>(count(shard, w.bucket))) +
                                   static_cast<uint64_t>(pos - static_cast<int64_t>(shard) * chunk)) *
                                      4;
      reader.read(shard, at, out, static_cast<size_t>(take) * 4);
      out += take;
      pos += take;
    }
    if (!r.dst.device().is_cpu()) {
      Tensor dst = r.dst;
      dst.copy_from(host);
    }
  }
}

void load_checkpoint(const CheckpointInfo& ckpt, Model& model, Optimizer& optimizer) {
  load_named_tensors(model.state_tensors(), (fs::path(ckpt.dir) / kModelFile).string());
  if (ckpt.shards) {  // each rank reads the byte ranges of its own state: nobody holds the whole of it
    std::vector<int64_t> sizes;
    for (const Param* p : model.params()) sizes.push_back(p->value.numel());
    load_state_ranges(ckpt, optimizer.state_ranges(), sizes);
  } else {
    load_named_tensors(optimizer.state(), (fs::path(ckpt.dir) / kOptimizerFile).string());
    optimizer.shard_state();  // dist.zero: this rank's part of the whole state, at whatever world size wrote it
  }
  optimizer.set_steps_taken(ckpt.progress.optimizer_steps);
}

}  // namespace gt
