// `gputrain runs`: run directories found, read (hostile files never crash it) and tabulated.
#include "train/runs.h"

#include "config/config.h"
#include "core/error.h"
#include "core/ownership.h"
#include "core/json.h"
#include "core/json_read.h"
#include "core/quote.h"
#include "train/run_dir.h"

#include <fmt/format.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <system_error>

namespace gt {
namespace fs = std::filesystem;

namespace {

// summary.json and a config are small; a file past this is not one a run wrote.
constexpr size_t kMaxFileBytes = size_t{1} << 20;
// Enough of metrics.jsonl's end to hold its last rows.
constexpr size_t kMetricsTail = size_t{64} << 10;

// Up to `limit` bytes read from `offset`, only from a regular file (a FIFO would block the open, /dev/zero never
// end); nullopt when the file is absent or not regular. `truncated` says whether bytes were left unread.
std::optional<std::string> read_bounded(const fs::path& p, size_t limit, bool* truncated = nullptr,
                                        uintmax_t offset = 0) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  if (offset) in.seekg(static_cast<std::streamoff>(offset));
  std::string text(limit + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (truncated) *truncated = text.size() > limit;
  if (text.size() > limit) text.resize(limit);
  return text;
}

// What a file that is not a regular one is, for a message.
const char* file_kind(const fs::file_status& st) {
  if (fs::is_directory(st)) return "directory";
  if (fs::is_fifo(st)) return "FIFO";
  if (fs::is_socket(st)) return "socket";
  if (fs::is_character_file(st)) return "character device";
  if (fs::is_block_file(st)) return "block device";
  return "special file";
}

void flatten(const YAML::Node& n, const std::string& path, std::vector<std::pair<std::string, std::string>>& out) {
  if (n.IsMap()) {
    if (n.size() == 0) out.emplace_back(path, "{}");
    for (const auto& kv : n) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : YAML::Dump(kv.first);
      flatten(kv.second, path.empty() ? key : path + "." + key, out);
    }
  } else if (n.IsSequence()) {
    if (n.size() == 0) out.emplace_back(path, "[]");
    for (size_t i = 0; i < n.size(); ++i) flatten(n[i], fmt::format("{}[{}]", path, i), out);
  } else if (n.IsScalar()) {
    out.emplace_back(path, n.Scalar());
  } else {
    out.emplace_back(path, "null");
  }
}

// The last train row of metrics.jsonl: steps and elapsed time of a run without summary.json.
void read_progress(RunInfo& run) {
  const fs::path p = fs::path(run.dir) / "metrics.jsonl";
  std::error_code ec;
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) return;
  const auto tail = read_bounded(p, kMetricsTail, nullptr, size > kMetricsTail ? size - kMetricsTail : 0);
  if (!tail) return;
  size_t end = tail->size();
  while (end > 0) {
    const size_t start = tail->rfind('\n', end - 1);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    const std::string line = tail->substr(from, end - from);
    end = start == std::string::npos ? 0 : start;
    try {
      const JsonValue row = json_read_object(line);
      const JsonValue* type = row.find("type");
      const JsonValue* step = row.find("step");
      if (!type || !type->is_string() || type->string != "train" || !step || !step->integer) continue;
      run.steps = *step->integer;
      if (const JsonValue* t = row.find("elapsed_s"); t && t->is_number()) run.wall_seconds = t->number;
      return;
    } catch (const Error&) {
      // a line cut short by a write in progress, or by the start of the tail: look further back
    }
  }
}

void read_summary(RunInfo& run, const std::string& text, bool truncated) {
  try {
    if (truncated) throw DataError(fmt::format("larger than {} bytes", kMaxFileBytes));
    const JsonValue s = json_read_object(text);
    const JsonValue* reason = s.find("exit_reason");
    if (!reason || !reason->is_string() || reason->string.empty())
      throw DataError("no exit_reason (a summary.json that gputrain did not write)");
    run.status = reason->string;
    for (const JsonMember& m : s.members) {
      if (!m.value.is_number()) continue;
      if (m.key == "steps")
        run.steps = m.value.integer ? *m.value.integer : static_cast<int64_t>(m.value.number);
      else if (m.key == "wall_seconds")
        run.wall_seconds = m.value.number;
      else
        run.metrics.emplace_back(m.key, m.value.number);
    }
  } catch (const Error& e) {
    run.status = "unreadable";
    run.problem = fmt::format("summary.json: {}", e.what());
    run.steps.reset();
    run.wall_seconds.reset();
    run.metrics.clear();
  }
}

std::string format_number(double v, bool integer) {
  if (integer) return fmt::format("{}", static_cast<int64_t>(v));
  const double a = std::fabs(v);
  if (a >= 1000) return fmt::format("{:.0f}", v);
  if (a >= 1e-3 || v == 0) return fmt::format("{:.4f}", v);
  return fmt::format("{:.3e}", v);
}

RunCell number_cell(double v, std::string text) { return {RunCell::Kind::number, std::move(text), v}; }

RunCell config_cell(const std::string& text) {
  // config.resolved.yaml writes 0.3 as 0.29999999999999999: the table shows the shortest text that reads back.
  if (const auto v = finite_number(text)) return number_cell(*v, fmt::format("{}", *v));
  if (text == "true" || text == "false") return {RunCell::Kind::boolean, text, text == "true" ? 1.0 : 0.0};
  return {RunCell::Kind::text, text, 0};
}

// A cell's text for the aligned table: control bytes escaped, so that a name cannot break the lines.
std::string printable(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  return out;
}

// Display width: UTF-8 continuation bytes take no column.
size_t width(const std::string& s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// Numbers in full for CSV (the table rounds them): the shortest text that reads back as the same double.
std::string full_number(const RunCell& c) {
  return c.kind == RunCell::Kind::number ? fmt::format("{}", c.number) : c.text;
}

}  // namespace

std::optional<double> finite_number(const std::string& s) {
  double v = 0;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (b != e && *b == '+') ++b;
  const auto [end, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || end != e || b == e || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::vector<RunInfo> find_runs(const std::vector<std::string>& paths) {
  std::vector<RunInfo> runs;
  std::set<fs::path> seen;  // a run named twice (`runs sweep sweep/a`) is listed once
  auto add = [&](RunInfo r) {
    std::error_code ec;
    const fs::path key = fs::weakly_canonical(r.dir, ec);
    if (seen.insert(ec ? fs::path(r.dir) : key).second) runs.push_back(std::move(r));
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!fs::is_directory(path, ec))
      throw ConfigError(fmt::format("{}: {}", path, fs::exists(path, ec) ? "not a folder" : "no such folder"));
    if (holds_run_files(path)) {
      RunInfo r;
      r.dir = path;
      const fs::path whole = fs::absolute(path, ec).lexically_normal();
      r.label = whole.filename().string();
      if (r.label.empty()) r.label = whole.parent_path().filename().string();  // "run/" has an empty last part
      if (r.label.empty()) r.label = path;
      add(std::move(r));
      continue;
    }
    // Children that are runs; children that are not, one level further (runs/<name>/<time>/).
    auto subfolders = [](const fs::path& d) {
      std::vector<fs::path> out;
      std::error_code e;
      for (fs::directory_iterator it(d, e), end; !e && it != end; it.increment(e))
        if (it->is_directory(e)) out.push_back(it->path());
      std::sort(out.begin(), out.end());
      return out;
    };
    for (const fs::path& child : subfolders(path)) {
      std::vector<fs::path> found;
      if (holds_run_files(child.string())) {
        found.push_back(child);
      } else {
        for (const fs::path& grandchild : subfolders(child))
          if (holds_run_files(grandchild.string())) found.push_back(grandchild);
      }
      for (const fs::path& f : found) {
        RunInfo r;
        r.dir = f.string();
        r.label = f.lexically_relative(path).string();
        add(std::move(r));
      }
    }
  }
  return runs;
}

void read_run(RunInfo& run) {
  const fs::path dir = run.dir;
  bool truncated = false;
  const bool running = run_is_alive(dir.string());
  std::error_code ec;
  const fs::file_status summary_status = fs::status(dir / "summary.json", ec);
  if (const auto summary = read_bounded(dir / "summary.json", kMaxFileBytes, &truncated); summary && !running) {
    read_summary(run, *summary, truncated);
  } else if (!running && fs::exists(summary_status)) {
    // A summary.json that is there but cannot be read (a directory, a FIFO, no permission) is no sign that the run
    // failed: it is unreadable, as a corrupt one is.
    run.status = "unreadable";
    run.problem = fs::is_regular_file(summary_status)
                      ? "summary.json: cannot be opened for reading"
                      : fmt::format("summary.json: not a regular file (a {})", file_kind(summary_status));
  } else {
    // No summary yet (or one left by an earlier start of a run now resumed): how far metrics.jsonl got.
    run.status = running ? "running" : "failed";
    read_progress(run);
  }
  if (const auto text = read_bounded(dir / "overrides.json", kMaxFileBytes)) {
    try {
      const JsonValue o = json_read_object(*text);
      const JsonValue* list = o.find("overrides");
      if (!list || !list->is_array()) throw DataError("no \"overrides\" list");
      std::vector<std::string> got;
      for (const JsonValue& v : list->items) {
        if (!v.is_string()) throw DataError("an override that is not a string");
        got.push_back(v.string);
      }
      run.overrides = std::move(got);
    } catch (const Error& e) {
      if (run.problem.empty()) run.problem = fmt::format("overrides.json: {}", e.what());
    }
  }
  const fs::path cfg = dir / "config.resolved.yaml";
  if (fs::exists(cfg, ec)) {
    try {
      if (!fs::is_regular_file(cfg, ec)) throw ConfigError("not a regular file");
      const ConfigNode root = ConfigNode::load_file(cfg.string());
      if (!root.is_map()) throw ConfigError("not a map of settings");
      flatten(root.yaml(), "", run.config);
      run.has_config = true;
    } catch (const Error& e) {
      run.config.clear();
      if (run.problem.empty()) run.problem = fmt::format("config.resolved.yaml: {}", e.what());
    }
  }
}

namespace {

// "3f9a1c2e (12 layers)": FNV-1a over the model section's keys and values, and how many layers it lists.
std::string model_digest(const std::vector<std::pair<std::string, std::string>>& config) {
  std::string model;
  std::set<std::string> layers;
  for (const auto& [k, v] : config) {
    if (k != "model" && k.rfind("model.", 0) != 0) continue;
    model += k + '\n' + v + '\n';
    if (k.rfind("model.layers[", 0) == 0) layers.insert(k.substr(0, k.find(']') + 1));
  }
  return fmt::format("{:08x} ({} layers)", fnv1a(model), layers.size());
}

}  // namespace

RunsTable runs_table(const std::vector<RunInfo>& runs) {
  RunsTable t;
  // Config keys in the order first seen; a key differs when the runs with a config do not all have one value for it
  // (a key some lack differs too).
  std::vector<std::string> keys;
  std::map<std::string, std::vector<std::optional<std::string>>> values;
  size_t with_config = 0;
  for (const RunInfo& r : runs) {
    if (!r.has_config) continue;
    for (const auto& [k, v] : r.config) {
      auto& column = values[k];
      if (column.empty()) keys.push_back(k);
      column.resize(with_config + 1);
      column[with_config] = v;
    }
    ++with_config;
  }
  std::vector<std::string> differing;
  for (const std::string& k : keys) {
    auto& column = values[k];
    column.resize(with_config);
    if (std::adjacent_find(column.begin(), column.end(), std::not_equal_to<>()) != column.end()) differing.push_back(k);
  }
  // Models that differ are one column, not one per differing layer key (runs of different models would otherwise
  // print thousands of columns): a short hash of the whole model section and its layer count.
  const auto is_model_key = [](const std::string& k) { return k == "model" || k.rfind("model.", 0) == 0; };
  const auto first_model = std::find_if(differing.begin(), differing.end(), is_model_key);
  const bool fold_model = first_model != differing.end();
  if (fold_model) {
    const auto at = first_model - differing.begin();
    differing.erase(std::remove_if(differing.begin(), differing.end(), is_model_key), differing.end());
    differing.insert(differing.begin() + at, "model");
  }
  // The final losses and accuracy first, then the rest of summary.json's numbers in the order first seen.
  std::vector<std::string> metrics;
  auto has_metric = [&](const std::string& k) {
    return std::any_of(runs.begin(), runs.end(), [&](const RunInfo& r) {
      return std::any_of(r.metrics.begin(), r.metrics.end(), [&](const auto& kv) { return kv.first == k; });
    });
  };
  for (const char* k : {"final_train_loss", "test_loss", "test_accuracy", "test_bpb", "samples_per_sec"})
    if (has_metric(k)) metrics.emplace_back(k);
  // How a run was set up rather than how it did (world_size, threads, epochs): shown, as config keys are, only
  // when the runs that have a summary differ in it.
  auto same_setting = [&](const std::string& k) {
    if (k != "world_size" && k != "threads" && k != "epochs") return false;
    std::optional<std::optional<double>> first;
    for (const RunInfo& r : runs) {
      if (r.status == "unreadable" || r.metrics.empty()) continue;
      const auto it = std::find_if(r.metrics.begin(), r.metrics.end(), [&](const auto& kv) { return kv.first == k; });
      const std::optional<double> v = it == r.metrics.end() ? std::nullopt : std::optional<double>(it->second);
      if (!first)
        first = v;
      else if (*first != v)
        return false;
    }
    return true;
  };
  for (const RunInfo& r : runs)
    for (const auto& [k, v] : r.metrics)
      if (std::find(metrics.begin(), metrics.end(), k) == metrics.end() && !same_setting(k)) metrics.push_back(k);

  t.columns.push_back("run");
  t.columns.insert(t.columns.end(), differing.begin(), differing.end());
  for (const char* c : {"status", "steps", "wall_s"}) t.columns.emplace_back(c);
  t.columns.insert(t.columns.end(), metrics.begin(), metrics.end());

  for (const RunInfo& r : runs) {
    std::vector<RunCell> row;
    row.push_back({RunCell::Kind::text, r.label, 0});
    for (const std::string& k : differing) {
      if (fold_model && k == "model") {
        row.push_back(r.has_config ? RunCell{RunCell::Kind::text, model_digest(r.config), 0} : RunCell{});
        continue;
      }
      const auto it = std::find_if(r.config.begin(), r.config.end(), [&](const auto& kv) { return kv.first == k; });
      row.push_back(it == r.config.end() ? RunCell{} : config_cell(it->second));
    }
    row.push_back({RunCell::Kind::text, r.status, 0});
    row.push_back(r.steps ? number_cell(static_cast<double>(*r.steps), std::to_string(*r.steps)) : RunCell{});
    row.push_back(r.wall_seconds ? number_cell(*r.wall_seconds, fmt::format("{:.1f}", *r.wall_seconds)) : RunCell{});
    for (const std::string& k : metrics) {
      const auto it = std::find_if(r.metrics.begin(), r.metrics.end(), [&](const auto& kv) { return kv.first == k; });
      const bool integer = it != r.metrics.end() && it->second == std::trunc(it->second) &&
                           std::fabs(it->second) < 1e15 && (k == "epochs" || k == "world_size" || k == "threads");
      row.push_back(it == r.metrics.end() ? RunCell{} : number_cell(it->second, format_number(it->second, integer)));
    }
    t.rows.push_back(std::move(row));
    t.dirs.push_back(r.dir);
    t.overrides.push_back(r.overrides);
  }
  return t;
}

void sort_runs(RunsTable& t, const std::string& column, bool descending) {
  const auto at = std::find(t.columns.begin(), t.columns.end(), column);
  if (at == t.columns.end()) {
    std::string list;
    for (const auto& c : t.columns) list += (list.empty() ? "" : ", ") + c;
    const std::string near = closest_match(column, t.columns);
    throw ConfigError(fmt::format("--sort {}: no such column{}; the columns are {}", column,
                                  near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near), list));
  }
  const size_t c = static_cast<size_t>(at - t.columns.begin());
  std::vector<size_t> order(t.rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Missing last; then numbers (and booleans) before text; within a kind by value, reversed when descending.
  auto rank = [](const RunCell& x) { return x.kind == RunCell::Kind::missing ? 2 : x.kind == RunCell::Kind::text; };
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
    const RunCell &a = t.rows[i][c], &b = t.rows[j][c];
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (a.kind == RunCell::Kind::missing) return false;
    const bool text = a.kind == RunCell::Kind::text;
    return descending ? (text ? b.text < a.text : b.number < a.number) : (text ? a.text < b.text : a.number < b.number);
  });
  RunsTable sorted{t.columns, {}, {}, {}};
  for (size_t i : order) {
    sorted.rows.push_back(std::move(t.rows[i]));
    sorted.dirs.push_back(std::move(t.dirs[i]));
    sorted.overrides.push_back(i < t.overrides.size() ? std::move(t.overrides[i]) : std::nullopt);
  }
  t = std::move(sorted);
}

std::string runs_text(const RunsTable& t) {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({});
  for (const auto& c : t.columns) cells.back().push_back(printable(c));
  for (const auto& row : t.rows) {
    cells.push_back({});
    for (const RunCell& c : row) cells.back().push_back(c.kind == RunCell::Kind::missing ? "-" : printable(c.text));
  }
  std::vector<size_t> widths(t.columns.size(), 0);
  for (const auto& line : cells)
    for (size_t i = 0; i < line.size(); ++i) widths[i] = std::max(widths[i], width(line[i]));
  // A column is right-aligned when every value in it is a number.
  std::vector<bool> right(t.columns.size(), false);
  for (size_t i = 0; i < t.columns.size(); ++i) {
    bool any = false, all = true;
    for (const auto& row : t.rows) {
      if (row[i].kind == RunCell::Kind::missing) continue;
      any = true;
      all = all && row[i].kind == RunCell::Kind::number;
    }
    right[i] = any && all;
  }
  std::string out;
  for (const auto& line : cells) {
    std::string l;
    for (size_t i = 0; i < line.size(); ++i) {
      const std::string pad(widths[i] - width(line[i]), ' ');
      if (i) l += "  ";
      l += right[i] ? pad + line[i] : line[i] + pad;
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + "\n";
  }
  return out;
}

std::string runs_csv(const RunsTable& t) {
  std::string out;
  for (size_t i = 0; i < t.columns.size(); ++i) {
    if (i) out += ',';
    out += csv_field(t.columns[i]);
  }
  out += '\n';
  for (const auto& row : t.rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i) out += ',';
      if (row[i].kind != RunCell::Kind::missing) out += csv_field(full_number(row[i]));
    }
    out += '\n';
  }
  return out;
}

std::string runs_jsonl(const RunsTable& t) {
  std::string out;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    JsonObject o;
    for (size_t i = 0; i < t.columns.size(); ++i) {
      const RunCell& c = t.rows[r][i];
      const std::string& k = t.columns[i];
      switch (c.kind) {
        case RunCell::Kind::missing: o.add_null(k); break;
        case RunCell::Kind::text: o.add(k, c.text); break;
        case RunCell::Kind::boolean: o.add_bool(k, c.number != 0); break;
        case RunCell::Kind::number:
          if (k == "steps")
            o.add(k, static_cast<int64_t>(c.number));
          else
            o.add(k, c.number);
          break;
      }
      if (i == 0) o.add("dir", t.dirs[r]);
    }
    // A list of strings: JsonObject writes objects and lists of objects, so the list is spliced in as text.
    std::string line = o.str();
    std::string list = "null";
    if (r < t.overrides.size() && t.overrides[r]) {
      list.clear();
      for (const std::string& v : *t.overrides[r]) list += (list.empty() ? "" : ", ") + json_quote(v);
      list = "[" + list + "]";
    }
    line.insert(line.size() - 1, ", \"overrides\": " + list);
    out += line + "\n";
  }
  return out;
}

}  // namespace gt
