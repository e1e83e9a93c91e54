// Output ownership: reading and writing gputrain-output.json, recognising older outputs by their files, and the
// checks every writer runs before it writes.
#include "core/ownership.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/json_read.h"
#include "core/quote.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

namespace gt {
namespace fs = std::filesystem;

namespace {

constexpr std::array<std::pair<Owner, const char*>, 4> kOwnerWords = {{
    {Owner::run, "run"},
    {Owner::sweep, "sweep"},
    {Owner::tokenization, "tokenize"},
    {Owner::import, "import"},
}};

std::optional<Owner> owner_from_word(const std::string& word) {
  for (const auto& [owner, w] : kOwnerWords)
    if (word == w) return owner;
  return std::nullopt;
}

// The first `max` bytes of a regular file, or nothing.
std::optional<std::string> read_head(const fs::path& path, size_t max) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(max, '\0');
  in.read(text.data(), static_cast<std::streamsize>(max));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// A run's own files: what `gputrain train` writes first (and what runs are found by).
bool run_files_in(const fs::path& d) {
  std::error_code ec;
  for (const char* f : {"config.resolved.yaml", "metrics.jsonl", "summary.json"})
    if (present(d / f)) return true;
  return fs::is_directory(d / "checkpoints", ec);
}

// Shards of `gputrain tokenize` (train_000000.bin, val_000003.bin …) and the temporaries of their atomic writes.
bool is_shard_name(const std::string& name) {
  for (const std::string prefix : {"train_", "val_"}) {
    if (name.rfind(prefix, 0) != 0) continue;
    std::string rest = name.substr(prefix.size());
    if (rest.size() > 4 && rest.compare(rest.size() - 4, 4, ".tmp") == 0) rest.resize(rest.size() - 4);
    if (rest.size() != 10 || rest.compare(6, 4, ".bin") != 0) return false;
    return std::all_of(rest.begin(), rest.begin() + 6, [](char c) { return c >= '0' && c <= '9'; });
  }
  return false;
}

// The entries of a folder, sorted (names only); `limit` bounds how many are read.
std::vector<std::string> entries(const fs::path& dir, size_t limit) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end && out.size() < limit; it.increment(ec))
    out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Folders written before manifests existed, recognised by the files their command writes.
bool recognise_older_output(const fs::path& d, FolderOwnership& o) {
  if (present(d / "sweep.json") || present(d / "sweep.sbatch")) {
    o.owner = Owner::sweep;
    o.evidence = present(d / "sweep.json") ? "sweep.json" : "sweep.sbatch";
    return true;
  }
  if (run_files_in(d)) {
    o.owner = Owner::run;
    return true;
  }
  if (const auto t = read_head(d / "tokenizer.json", 4096); t && t->find("llm.c token shards") != std::string::npos) {
    o.owner = Owner::tokenization;
    o.evidence = "tokenizer.json";
    for (const std::string& name : entries(d, 1 << 20))
      if (is_shard_name(name)) o.files.push_back(name);
    o.files.push_back("tokenizer.json");
    return true;
  }
  if (const auto c = read_head(d / "config.yaml", 64);
      c && c->rfind("# Imported from llm.c's checkpoint", 0) == 0 && present(d / "model.safetensors")) {
    o.owner = Owner::import;
    o.evidence = "config.yaml";
    o.files = {"config.yaml", "model.safetensors"};
    return true;
  }
  return false;
}

// Reads the manifest; false (with o.evidence saying why) when it is not one gputrain wrote.
bool read_manifest(const fs::path& path, FolderOwnership& o) {
  const auto text = read_head(path, size_t{16} << 20);
  if (!text) {
    o.evidence = std::string(kManifestFile) + " (not a readable file)";
    return false;
  }
  try {
    const JsonValue v = json_read_object(*text);
    const JsonValue* owner = v.find("owner");
    const std::optional<Owner> kind = owner && owner->is_string() ? owner_from_word(owner->string) : std::nullopt;
    if (!kind) throw DataError("no known \"owner\"");
    o.owner = *kind;
    if (const JsonValue* c = v.find("complete"); c && c->type == JsonValue::Type::boolean) o.complete = c->boolean;
    if (const JsonValue* files = v.find("files"); files && files->is_array())
      for (const JsonValue& f : files->items)
        if (f.is_string()) o.files.push_back(f.string);
    o.evidence = o.owner == Owner::sweep && present(path.parent_path() / "sweep.json") ? "sweep.json" : kManifestFile;
    return true;
  } catch (const DataError& e) {
    o.evidence = fmt::format("{} (unreadable: {})", kManifestFile, e.what());
    return false;
  }
}

// A name a manifest may list for removal: a plain name in the folder, never a path out of it.
bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos && name != kManifestFile;
}

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = path;
  return fs::weakly_canonical(p, ec).string();
}

// The nearest folder above `path` that a command owns by its manifest or its files (a sweep is not counted when
// `owner` is a run: a sweep's trials are runs inside it).
std::optional<std::pair<fs::path, FolderOwnership>> owned_ancestor(const std::string& path,
                                                                   std::optional<Owner> owner) {
  const fs::path p = absolute_path(path);
  for (fs::path dir = p.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    FolderOwnership o = folder_ownership(dir.string());
    if (o.state == FolderOwnership::State::owned && !(owner == Owner::run && o.owner == Owner::sweep))
      return std::make_pair(dir, std::move(o));
    if (dir == dir.root_path()) break;
  }
  return std::nullopt;
}

const char* command_of(Owner owner) {
  switch (owner) {
    case Owner::run: return "train";
    case Owner::sweep: return "sweep";
    case Owner::tokenization: return "tokenize";
    case Owner::import: return "import llmc";
  }
  return "gputrain";
}

// An output whose command never finished writing it (a tokenization or an import cut short): any later run of the
// same command may replace it.
bool unfinished_output(const FolderOwnership& o) {
  return !o.complete && o.owner != Owner::run && o.owner != Owner::sweep;
}

}  // namespace

const char* owner_word(Owner owner) {
  for (const auto& [o, w] : kOwnerWords)
    if (o == owner) return w;
  return "run";
}

bool holds_run_files(const std::string& dir) { return run_files_in(dir); }

FolderOwnership folder_ownership(const std::string& dir) {
  FolderOwnership o;
  const fs::path d = dir;
  std::error_code ec;
  const fs::file_status st = fs::status(d, ec);
  if (!fs::exists(st)) {
    o.state = present(d) ? FolderOwnership::State::not_a_folder : FolderOwnership::State::missing;
    return o;
  }
  if (!fs::is_directory(st)) {
    o.state = FolderOwnership::State::not_a_folder;
    return o;
  }
  o.run_data = run_files_in(d);
  o.finished_run = present(d / "summary.json");
  for (const char* f : {"summary.json", "checkpoints", "metrics.jsonl", "config.resolved.yaml"})
    if (o.run_evidence.empty() && present(d / f)) o.run_evidence = f;
  if (present(d / kManifestFile)) {
    o.has_manifest = true;
    o.state = read_manifest(d / kManifestFile, o) ? FolderOwnership::State::owned : FolderOwnership::State::foreign;
    return o;
  }
  if (recognise_older_output(d, o)) {
    o.state = FolderOwnership::State::owned;
    return o;
  }
  // A run's lock (.lock, taken before its manifest is written) alone does not make a folder anyone else's.
  std::vector<std::string> names = entries(d, 2);
  names.erase(std::remove(names.begin(), names.end(), ".lock"), names.end());
  if (names.empty()) {
    o.state = FolderOwnership::State::empty;
    return o;
  }
  o.state = FolderOwnership::State::foreign;
  o.evidence = names.front();
  return o;
}

std::string describe_ownership(const FolderOwnership& o) {
  using State = FolderOwnership::State;
  switch (o.state) {
    case State::missing: return "nothing";
    case State::empty: return "an empty folder";
    case State::not_a_folder: return "not a folder";
    case State::foreign:
      return fmt::format("files gputrain did not write ({}{})", quote_value(o.evidence), o.has_manifest ? "" : ", …");
    case State::owned: break;
  }
  std::string what;
  switch (o.owner) {
    case Owner::run:
      if (o.run_data)
        return fmt::format("{} ({})", o.finished_run ? "a finished run" : "an unfinished run", o.run_evidence);
      what = "a run's folder";
      break;
    case Owner::sweep: return fmt::format("a sweep ({})", o.evidence);
    case Owner::tokenization: what = o.complete ? "a tokenization" : "a tokenization that never finished"; break;
    case Owner::import: what = o.complete ? "an llm.c import" : "an llm.c import that never finished"; break;
  }
  std::string files;  // what would be replaced
  for (size_t i = 0; i < o.files.size() && i < 3; ++i) files += (i ? ", " : "") + o.files[i];
  if (o.files.size() > 3) files += fmt::format(" and {} more", o.files.size() - 3);
  return fmt::format("{} ({})", what, files.empty() ? o.evidence : files);
}

void write_manifest(const std::string& dir, Owner owner, const std::vector<std::string>& files, bool complete) {
  std::string list;
  for (const std::string& f : files) list += (list.empty() ? "" : ", ") + json_quote(f);
  const std::string text = JsonObject()
                               .add("owner", owner_word(owner))
                               .add("gputrain_version", GPUTRAIN_VERSION)
                               .add_bool("complete", complete)
                               .str();
  // The list goes last, after the small fields a reader looks at first.
  write_file_atomic((fs::path(dir) / kManifestFile).string(),
                    text.substr(0, text.size() - 1) + ", \"files\": [" + list + "]}\n");
}

FolderOwnership check_output_folder(const std::string& flag, const std::string& dir, Owner owner, Reuse reuse,
                                    const std::string& hint) {
  using State = FolderOwnership::State;
  const std::string where = fmt::format("{} {}", flag, dir);
  const std::string cmd = command_of(owner);
  if (dir.empty()) throw ConfigError(fmt::format("{}: an empty path", flag));
  if (const auto above = owned_ancestor(dir, owner))
    throw ConfigError(
        fmt::format("{}: inside {}, which holds {}; {} does not write into another command's output: "
                    "choose a folder outside it",
                    where, above->first.string(), describe_ownership(above->second), cmd));
  FolderOwnership o = folder_ownership(dir);
  switch (o.state) {
    case State::not_a_folder: throw ConfigError(fmt::format("{}: exists and is not a folder", where));
    case State::foreign:
      throw ConfigError(fmt::format("{}: holds {}; {} writes only into a new or empty folder, or one it wrote itself",
                                    where, describe_ownership(o), cmd));
    case State::missing:
    case State::empty: return o;
    case State::owned: break;
  }
  // A run's folder that no run has written into yet (a sweep prepares its trials' folders so) starts like a new one.
  if (o.owner == Owner::run && owner == Owner::run && !o.run_data) return o;
  if (o.owner != owner)
    throw ConfigError(
        fmt::format("{}: holds {}; {} does not write into another command's output: choose another "
                    "folder",
                    where, describe_ownership(o), cmd));
  if (reuse == Reuse::never && !unfinished_output(o))
    throw ConfigError(
        fmt::format("{}: holds {} already{}{}", where, describe_ownership(o), hint.empty() ? "" : "; ", hint));
  return o;
}

ClaimedFolder claim_output_folder(const std::string& flag, const std::string& dir, Owner owner, Reuse reuse,
                                  const std::string& hint) {
  using State = FolderOwnership::State;
  const FolderOwnership o = check_output_folder(flag, dir, owner, reuse, hint);
  ClaimedFolder c;
  c.dir = dir;
  if (o.state != State::owned) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error(fmt::format("{}: cannot create the folder: {}", dir, ec.message()));
    write_manifest(dir, owner, {}, owner == Owner::run || owner == Owner::sweep);
    c.created = true;
    return c;
  }
  if (o.owner == Owner::run && !o.run_data) {  // a prepared run folder
    if (!o.has_manifest) write_manifest(dir, owner, {}, true);
    c.created = true;
    return c;
  }
  if (reuse == Reuse::resume && !unfinished_output(o)) return c;
  // Replace: the earlier output's files go first, so that none of them outlives it (a glob would still match a
  // stale shard), then the folder is this command's again, not yet complete.
  for (const std::string& name : o.files) {
    if (!is_plain_name(name)) continue;
    for (const std::string& f : {name, name + ".tmp"}) {
      std::error_code ec;
      const fs::path p = fs::path(dir) / f;
      if (!fs::is_regular_file(fs::symlink_status(p, ec))) continue;
      if (!fs::remove(p, ec) || ec)
        throw Error(fmt::format("{}: cannot remove the earlier output's file: {}", p.string(), ec.message()));
      if (f == name) c.removed.push_back(name);
    }
  }
  write_manifest(dir, owner, {}, false);
  fsync_dir(dir);
  return c;
}

void refuse_input_inside(const std::string& flag, const std::string& dir, const std::vector<std::string>& inputs) {
  const fs::path out = absolute_path(dir);
  for (const std::string& in : inputs) {
    const fs::path p = absolute_path(in);
    const fs::path rel = p.lexically_relative(out);
    if (!rel.empty() && *rel.begin() != "..")
      throw ConfigError(fmt::format("{} {}: holds this command's input {}; write into another folder", flag, dir, in));
  }
}

void refuse_output_file(const std::string& flag, const std::string& path, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& allowed) {
  if (path.empty()) throw ConfigError(fmt::format("{}: an empty path", flag));
  std::error_code ec;
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    const bool same = fs::exists(path, ec) && fs::exists(in, ec) ? fs::equivalent(path, in, ec) && !ec
                                                                 : absolute_path(path) == absolute_path(in);
    if (same)
      throw ConfigError(
          fmt::format("{} {}: the same file as this command's input {}; it is not overwritten: write "
                      "elsewhere",
                      flag, path, in));
  }
  const auto above = owned_ancestor(path, std::nullopt);
  if (!above) return;
  const std::string name = fs::path(absolute_path(path)).filename().string();
  const bool top = fs::path(absolute_path(path)).parent_path() == above->first;
  if (top && std::find(allowed.begin(), allowed.end(), name) != allowed.end() && above->second.owner == Owner::run)
    return;
  throw ConfigError(fmt::format("{} {}: inside {}, which holds {}; it is not written there: write elsewhere", flag,
                                path, above->first.string(), describe_ownership(above->second)));
}

}  // namespace gt
