// `gputrain sweep`: planning (pure: axes → trials → sweep.json), the early-stopping rules (pure), and the runner that
// starts the trials as child processes, watches them and tabulates them with `gputrain runs`' table.
#include "train/sweep.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/json_read.h"
#include "core/ownership.h"
#include "core/quote.h"
#include "log/chart.h"
#include "log/report.h"
#include "train/run_dir.h"
#include "train/runs.h"
#include "train/signals.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

extern char** environ;

namespace gt {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxTagBytes = 96;
// The most of a metrics.jsonl that one poll reads (the rest comes with the next ones).
constexpr size_t kMaxMetricsBytes = size_t{64} << 20;

bool is_integer_text(const std::string& s) {
  if (s.empty()) return false;
  size_t i = s[0] == '-' || s[0] == '+' ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return s.size() < 16;  // exact in a double
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Splits at commas outside [] and {} (a YAML flow list or map is one value).
std::vector<std::string> split_values(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (const char c : s) {
    if (c == '[' || c == '{') ++depth;
    if ((c == ']' || c == '}') && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(trim(cur));
  return out;
}

// KEY=REST of a flag's value; ConfigError naming the flag otherwise.
std::pair<std::string, std::string> split_key(const std::string& flag, const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos)
    throw ConfigError(
        fmt::format("{} {}: expected KEY=VALUES (e.g. {} optimizer.lr=0.01,0.1)", flag, quote_value(spec), flag));
  const std::string key = trim(spec.substr(0, eq)), rest = spec.substr(eq + 1);
  if (key.empty() || key == "+" || key == "++" || key[0] == '~')
    throw ConfigError(fmt::format("{} {}: no key before '=' (a swept key is a --set key path, e.g. optimizer.lr)", flag,
                                  quote_value(spec)));
  if (trim(rest).empty()) throw ConfigError(fmt::format("{} {}: no values after '='", flag, quote_value(spec)));
  return {key, rest};
}

std::vector<std::string> parse_list(const std::string& flag, const std::string& spec, const std::string& rest) {
  std::vector<std::string> values = split_values(rest);
  std::set<std::string> seen;
  for (const std::string& v : values) {
    if (v.empty())
      throw ConfigError(fmt::format("{} {}: an empty value (two commas, or one at an end)", flag, quote_value(spec)));
    if (!seen.insert(v).second)
      throw ConfigError(fmt::format("{} {}: the value {} is given twice", flag, quote_value(spec), quote_value(v)));
  }
  return values;
}

// SplitMix64: the random draws' hash, the same on every platform (std:: distributions are not).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from (seed, draw, axis).
double unit_draw(uint64_t seed, int64_t draw, size_t axis) {
  const uint64_t h = mix(mix(mix(seed) ^ static_cast<uint64_t>(draw)) ^ (static_cast<uint64_t>(axis) + 1));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

std::string draw_value(const SweepAxis& a, double u) {
  if (a.kind == SweepAxis::Kind::choice) {
    const size_t i = std::min(a.values.size() - 1, static_cast<size_t>(u * static_cast<double>(a.values.size())));
    return a.values[i];
  }
  double v = a.kind == SweepAxis::Kind::log_uniform ? std::exp(std::log(a.lo) + u * (std::log(a.hi) - std::log(a.lo)))
                                                    : a.lo + u * (a.hi - a.lo);
  if (a.integer) {
    // Integers: each of lo..hi equally likely on a linear range; on a log range, the log value rounded.
    v = a.kind == SweepAxis::Kind::log_uniform ? std::round(v) : std::floor(a.lo + u * (a.hi - a.lo + 1));
    v = std::clamp(v, a.lo, a.hi);
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{:.4g}", v);
}

const char* kind_name(SweepAxis::Kind k) {
  switch (k) {
    case SweepAxis::Kind::grid: return "grid";
    case SweepAxis::Kind::choice: return "choice";
    case SweepAxis::Kind::uniform: return "uniform";
    case SweepAxis::Kind::log_uniform: return "log_uniform";
  }
  return "grid";
}

std::string json_list(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + json_quote(s);
  return "[" + out + "]";
}

std::string axis_json(const SweepAxis& a) {
  return fmt::format(R"({{"kind": {}, "key": {}, "spec": {}, "values": {}, "lo": {}, "hi": {}, "integer": {}}})",
                     json_quote(kind_name(a.kind)), json_quote(a.key), json_quote(a.spec), json_list(a.values), a.lo,
                     a.hi, a.integer ? "true" : "false");
}

// Readers of sweep.json's fields; DataError naming the field otherwise.
const JsonValue& member(const JsonValue& o, const std::string& key, JsonValue::Type type) {
  const JsonValue* v = o.find(key);
  if (!v || v->type != type) throw DataError(fmt::format("no field \"{}\" of the right type", key));
  return *v;
}
std::vector<std::string> string_list(const JsonValue& v) {
  std::vector<std::string> out;
  for (const JsonValue& i : v.items) {
    if (!i.is_string()) throw DataError("a list holds a value that is not a string");
    out.push_back(i.string);
  }
  return out;
}

SweepAxis read_axis(const JsonValue& o) {
  SweepAxis a;
  const std::string kind = member(o, "kind", JsonValue::Type::string).string;
  if (kind == "grid")
    a.kind = SweepAxis::Kind::grid;
  else if (kind == "choice")
    a.kind = SweepAxis::Kind::choice;
  else if (kind == "uniform")
    a.kind = SweepAxis::Kind::uniform;
  else if (kind == "log_uniform")
    a.kind = SweepAxis::Kind::log_uniform;
  else
    throw DataError(fmt::format("an axis of unknown kind {}", quote_value(kind)));
  a.key = member(o, "key", JsonValue::Type::string).string;
  a.spec = member(o, "spec", JsonValue::Type::string).string;
  a.values = string_list(member(o, "values", JsonValue::Type::array));
  a.lo = member(o, "lo", JsonValue::Type::number).number;
  a.hi = member(o, "hi", JsonValue::Type::number).number;
  a.integer = member(o, "integer", JsonValue::Type::boolean).boolean;
  return a;
}

// The best value of a curve up to `step` (inclusive), or nullopt when it has no point there.
std::optional<double> best_until(const Curve& c, int64_t step, bool maximize) {
  std::optional<double> best;
  for (const CurvePoint& p : c) {
    if (p.step > step) break;
    if (!std::isfinite(p.value)) continue;
    if (!best || (maximize ? p.value > *best : p.value < *best)) best = p.value;
  }
  return best;
}

bool worse(double a, double b, bool maximize) { return maximize ? a < b : a > b; }

// Linear-interpolated quantile q of sorted values.
double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (pos - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}

// Reads a regular file of at most `limit` bytes (its last `limit` bytes when larger); nullopt when absent.
std::optional<std::string> read_tail(const fs::path& p, size_t limit) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  if (size > limit) in.seekg(static_cast<std::streamoff>(size - limit));
  std::string text(std::min<uintmax_t>(size, limit), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

std::string last_lines(const std::string& text, size_t n) {
  size_t end = text.size();
  while (end > 0 && text[end - 1] == '\n') --end;
  size_t start = end;
  for (size_t lines = 0; start > 0; --start)
    if (text[start - 1] == '\n' && ++lines == n) break;
  return text.substr(start, end - start);
}

std::string now_stamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  return fmt::format("{}.{:03d}", stamp, ms);
}

// Shell single quotes (for the Slurm script).
}  // namespace

SweepAxis parse_grid_axis(const std::string& spec) {
  const auto [key, rest] = split_key("--grid", spec);
  SweepAxis a;
  a.kind = SweepAxis::Kind::grid;
  a.key = key;
  a.spec = spec;
  a.values = parse_list("--grid", spec, rest);
  return a;
}

SweepAxis parse_random_axis(const std::string& spec) {
  const auto [key, rest] = split_key("--random", spec);
  SweepAxis a;
  a.key = key;
  a.spec = spec;
  // LO:HI[:log] when there is a colon outside brackets and no comma; else a list of choices.
  if (rest.find(',') != std::string::npos || rest.find(':') == std::string::npos) {
    a.kind = SweepAxis::Kind::choice;
    a.values = parse_list("--random", spec, rest);
    if (a.values.size() < 2)
      throw ConfigError(
          fmt::format("--random {}: expected LO:HI, LO:HI:log or at least two values V1,V2,…", quote_value(spec)));
    return a;
  }
  std::vector<std::string> parts;
  for (size_t from = 0;;) {
    const size_t colon = rest.find(':', from);
    parts.push_back(trim(rest.substr(from, colon == std::string::npos ? std::string::npos : colon - from)));
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  if (parts.size() > 3 || (parts.size() == 3 && parts[2] != "log"))
    throw ConfigError(
        fmt::format("--random {}: expected LO:HI or LO:HI:log, got {} parts{}", quote_value(spec), parts.size(),
                    parts.size() == 3 ? fmt::format(" (the third, {}, is not \"log\")", quote_value(parts[2])) : ""));
  const auto lo = finite_number(parts[0]), hi = finite_number(parts[1]);
  if (!lo || !hi)
    throw ConfigError(fmt::format("--random {}: {} is not a finite number", quote_value(spec),
                                  quote_value(!lo ? parts[0] : parts[1])));
  if (!(*lo < *hi))
    throw ConfigError(fmt::format("--random {}: the low end {} must be below the high end {}", quote_value(spec),
                                  parts[0], parts[1]));
  a.kind = parts.size() == 3 ? SweepAxis::Kind::log_uniform : SweepAxis::Kind::uniform;
  if (a.kind == SweepAxis::Kind::log_uniform && *lo <= 0)
    throw ConfigError(
        fmt::format("--random {}: a log range needs a low end above 0, got {}", quote_value(spec), parts[0]));
  a.lo = *lo;
  a.hi = *hi;
  a.integer = is_integer_text(parts[0]) && is_integer_text(parts[1]);
  return a;
}

std::vector<std::string> SweepTrial::overrides() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values) out.push_back(k + "=" + v);
  return out;
}

std::string sweep_tag(const std::vector<std::pair<std::string, std::string>>& values) {
  std::string whole;
  for (const auto& [k, v] : values) whole += (whole.empty() ? "" : ",") + k + "=" + v;
  std::string tag;
  for (const char c : whole) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._=,+-", c) != nullptr;
    tag += ok && c != '\0' ? c : '_';
  }
  if (tag.size() > kMaxTagBytes) tag = fmt::format("{}~{:08x}", tag.substr(0, kMaxTagBytes - 9), fnv1a(whole));
  return tag;
}

SweepPlan plan_sweep(const std::string& config, const std::vector<std::string>& sets,
                     const std::vector<SweepAxis>& grid, const std::vector<SweepAxis>& random, int64_t draws,
                     uint64_t seed) {
  if (grid.empty() && random.empty())
    throw ConfigError("sweep: nothing to sweep: give at least one --grid KEY=V1,V2,… or --random KEY=LO:HI");
  if (!random.empty() && draws <= 0)
    throw ConfigError("sweep: --random needs --trials N (how many random draws, for each grid point)");
  if (random.empty() && draws > 0)
    throw ConfigError("sweep: --trials N counts random draws: it needs a --random axis (a grid is swept whole)");
  std::set<std::string> keys;
  for (const auto* axes : {&grid, &random})
    for (const SweepAxis& a : *axes) {
      std::string bare = a.key;
      while (!bare.empty() && bare[0] == '+') bare.erase(0, 1);
      if (!keys.insert(bare).second)
        throw ConfigError(
            fmt::format("sweep: the key {} is swept twice ({})", quote_if_needed(bare), quote_if_needed(a.spec)));
    }
  int64_t points = 1;
  for (const SweepAxis& a : grid) {
    points *= static_cast<int64_t>(a.values.size());
    if (points > kMaxSweepTrials) break;
  }
  const int64_t total = points * std::max<int64_t>(draws, 1);
  if (points > kMaxSweepTrials || total > kMaxSweepTrials)
    throw ConfigError(fmt::format("sweep: {} trials; one sweep runs at most {}",
                                  points > kMaxSweepTrials ? points : total, kMaxSweepTrials));

  SweepPlan plan;
  std::error_code ec;
  plan.config = fs::absolute(config, ec).lexically_normal().string();
  if (ec) plan.config = config;
  plan.sets = sets;
  plan.grid = grid;
  plan.random = random;
  plan.draws = random.empty() ? 0 : draws;
  plan.seed = seed;
  const int width = static_cast<int>(std::to_string(std::max<int64_t>(total - 1, 0)).size());
  std::vector<size_t> at(grid.size(), 0);  // the grid point as digits, the last axis fastest
  for (int64_t p = 0; p < points; ++p) {
    for (int64_t d = 0; d < std::max<int64_t>(draws, 1); ++d) {
      SweepTrial t;
      t.index = static_cast<int>(plan.trials.size());
      for (size_t i = 0; i < grid.size(); ++i) t.values.emplace_back(grid[i].key, grid[i].values[at[i]]);
      const int64_t draw = p * std::max<int64_t>(draws, 1) + d;
      for (size_t i = 0; i < random.size(); ++i)
        t.values.emplace_back(random[i].key, draw_value(random[i], unit_draw(seed, draw, i)));
      t.name = fmt::format("{:0{}}-{}", t.index, width, sweep_tag(t.values));
      plan.trials.push_back(std::move(t));
    }
    for (size_t i = grid.size(); i-- > 0;) {
      if (++at[i] < grid[i].values.size()) break;
      at[i] = 0;
    }
  }
  return plan;
}

const char* trial_status_name(TrialStatus s) {
  switch (s) {
    case TrialStatus::pending: return "pending";
    case TrialStatus::running: return "running";
    case TrialStatus::completed: return "completed";
    case TrialStatus::interrupted: return "interrupted";
    case TrialStatus::failed: return "failed";
    case TrialStatus::stopped_early: return "stopped_early";
  }
  return "pending";
}

std::string sweep_json(const SweepPlan& plan, const std::vector<TrialState>& states) {
  std::string grid, random, trials;
  for (const SweepAxis& a : plan.grid) grid += (grid.empty() ? "" : ", ") + axis_json(a);
  for (const SweepAxis& a : plan.random) random += (random.empty() ? "" : ", ") + axis_json(a);
  for (size_t i = 0; i < plan.trials.size(); ++i) {
    const SweepTrial& t = plan.trials[i];
    const TrialState s = i < states.size() ? states[i] : TrialState{};
    std::string values;
    for (const auto& [k, v] : t.values)
      values += fmt::format("{}[{}, {}]", values.empty() ? "" : ", ", json_quote(k), json_quote(v));
    trials += fmt::format(
        "{}\n    {{\"index\": {}, \"name\": {}, \"values\": [{}], \"status\": {}, \"exit_code\": {}, \"starts\": {}}}",
        trials.empty() ? "" : ",", t.index, json_quote(t.name), values, json_quote(trial_status_name(s.status)),
        s.exit_code, s.starts);
  }
  return fmt::format(
      "{{\"format\": \"gputrain-sweep\", \"version\": 1, \"config\": {}, \"sets\": {}, \"seed\": \"{}\", \"draws\": "
      "{},\n"
      "  \"grid\": [{}],\n  \"random\": [{}],\n  \"trials\": [{}\n  ]}}\n",
      json_quote(plan.config), json_list(plan.sets), plan.seed, plan.draws, grid, random, trials);
}

std::pair<SweepPlan, std::vector<TrialState>> read_sweep_json(const std::string& text, const std::string& path) {
  try {
    const JsonValue o = json_read_object(text);
    const JsonValue* format = o.find("format");
    if (!format || !format->is_string() || format->string != "gputrain-sweep")
      throw DataError("not a sweep.json that gputrain wrote (no \"format\": \"gputrain-sweep\")");
    SweepPlan plan;
    plan.config = member(o, "config", JsonValue::Type::string).string;
    plan.sets = string_list(member(o, "sets", JsonValue::Type::array));
    const std::string seed = member(o, "seed", JsonValue::Type::string).string;
    const auto [end, ec] = std::from_chars(seed.data(), seed.data() + seed.size(), plan.seed);
    if (ec != std::errc() || end != seed.data() + seed.size()) throw DataError("a seed that is not a number");
    const JsonValue& draws = member(o, "draws", JsonValue::Type::number);
    plan.draws = draws.integer ? *draws.integer : 0;
    for (const JsonValue& a : member(o, "grid", JsonValue::Type::array).items) plan.grid.push_back(read_axis(a));
    for (const JsonValue& a : member(o, "random", JsonValue::Type::array).items) plan.random.push_back(read_axis(a));
    std::vector<TrialState> states;
    std::set<std::string> names;
    for (const JsonValue& t : member(o, "trials", JsonValue::Type::array).items) {
      SweepTrial trial;
      const JsonValue& index = member(t, "index", JsonValue::Type::number);
      trial.index = static_cast<int>(index.integer.value_or(-1));
      if (trial.index != static_cast<int>(plan.trials.size())) throw DataError("trials out of order");
      trial.name = member(t, "name", JsonValue::Type::string).string;
      // A name is a folder below the sweep's: never a path that leads elsewhere.
      if (trial.name.empty() || trial.name.find('/') != std::string::npos || trial.name == "." || trial.name == ".." ||
          !names.insert(trial.name).second)
        throw DataError(fmt::format("a trial name that is not one folder: {}", quote_value(trial.name)));
      for (const JsonValue& kv : member(t, "values", JsonValue::Type::array).items) {
        const std::vector<std::string> pair = string_list(kv);
        if (pair.size() != 2) throw DataError("a trial value that is not a [key, value] pair");
        trial.values.emplace_back(pair[0], pair[1]);
      }
      TrialState s;
      const std::string status = member(t, "status", JsonValue::Type::string).string;
      bool known = false;
      for (TrialStatus k : {TrialStatus::pending, TrialStatus::running, TrialStatus::completed,
                            TrialStatus::interrupted, TrialStatus::failed, TrialStatus::stopped_early})
        if (status == trial_status_name(k)) {
          s.status = k;
          known = true;
        }
      if (!known) throw DataError(fmt::format("a trial of unknown status {}", quote_value(status)));
      s.exit_code = static_cast<int>(member(t, "exit_code", JsonValue::Type::number).integer.value_or(-1));
      s.starts = static_cast<int>(member(t, "starts", JsonValue::Type::number).integer.value_or(0));
      plan.trials.push_back(std::move(trial));
      states.push_back(s);
    }
    return {std::move(plan), std::move(states)};
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: {}", path, e.what()));
  }
}

bool median_rule_stops(const std::vector<Curve>& curves, size_t t, const EarlyStopParams& p) {
  const Curve& c = curves.at(t);
  if (c.size() <= static_cast<size_t>(std::max(p.grace, 0))) return false;
  const int64_t s = c.back().step;
  const auto mine = best_until(c, s, p.maximize);
  if (!mine) return false;
  std::vector<double> others;
  for (size_t u = 0; u < curves.size(); ++u) {
    if (u == t || curves[u].empty() || curves[u].back().step < s) continue;  // not there yet
    if (const auto v = best_until(curves[u], s, p.maximize)) others.push_back(*v);
  }
  if (others.empty() || others.size() < static_cast<size_t>(std::max(p.min_others, 1))) return false;
  std::sort(others.begin(), others.end());
  return worse(*mine, quantile(others, 0.5), p.maximize);
}

int asha_rung(const Curve& curve, const EarlyStopParams& p) {
  int rung = -1;
  double at = std::max(p.grace, 1);
  while (static_cast<double>(curve.size()) >= at) {
    ++rung;
    at *= std::max(p.eta, 1.5);
  }
  return rung;
}

bool asha_stops(const std::vector<Curve>& curves, size_t t, int rung, const EarlyStopParams& p) {
  if (rung < 0) return false;
  const double eta = std::max(p.eta, 1.5);
  const size_t point = static_cast<size_t>(std::llround(std::max(p.grace, 1) * std::pow(eta, rung)));  // 1-based
  auto value_at_rung = [&](const Curve& c) -> std::optional<double> {
    if (c.size() < point) return std::nullopt;
    return best_until(c, c[point - 1].step, p.maximize);
  };
  const auto mine = value_at_rung(curves.at(t));
  if (!mine) return false;
  std::vector<double> recorded;
  for (const Curve& c : curves)
    if (const auto v = value_at_rung(c)) recorded.push_back(*v);
  if (static_cast<double>(recorded.size()) < eta) return false;
  // Sorted from the best: the top 1/eta go on.
  std::sort(recorded.begin(), recorded.end(), [&](double a, double b) { return p.maximize ? a > b : a < b; });
  const double cutoff = quantile(recorded, 1.0 / eta);
  return worse(*mine, cutoff, p.maximize);
}

Curve read_curve(const std::string& text, const std::string& metric) {
  Curve c;
  size_t from = 0;
  while (from < text.size()) {
    size_t end = text.find('\n', from);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(from, end - from);
    from = end + 1;
    if (line.find(metric) == std::string::npos) continue;
    try {
      const JsonValue row = json_read_object(line);
      const JsonValue* v = row.find(metric);
      const JsonValue* step = row.find("step");
      if (!v || !v->is_number() || !step || !step->integer) continue;
      c.push_back({*step->integer, v->number});
    } catch (const Error&) {
      // a row cut short by a write in progress
    }
  }
  return c;
}

std::vector<std::string> trial_train_args(const SweepPlan& plan, const SweepTrial& trial, const std::string& out) {
  std::vector<std::string> args{"train", plan.config};
  std::vector<std::string> sets = plan.sets;
  for (const std::string& o : trial.overrides()) sets.push_back(o);
  for (const std::string& s : sets) {
    args.emplace_back("--set");
    args.push_back(s);
  }
  args.emplace_back("--out");
  args.push_back((fs::path(out) / trial.name).string());
  return args;
}

namespace {

// A trial's metrics.jsonl followed as it grows: each poll parses only the bytes added since the last (a long run
// with log_every 1 has a large file, and the sweep polls 5 times a second).
struct CurveFile {
  uintmax_t offset = 0;
  std::string partial;  // the start of a line not yet ended
  Curve curve;

  void update(const fs::path& path, const std::string& metric) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) return;
    if (size < offset) *this = {};  // cut back (a resume cuts metrics.jsonl back to its checkpoint's length)
    if (size == offset) return;
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    in.seekg(static_cast<std::streamoff>(offset));
    std::string chunk(static_cast<size_t>(std::min<uintmax_t>(size - offset, kMaxMetricsBytes)), '\0');
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    chunk.resize(static_cast<size_t>(in.gcount()));
    offset += chunk.size();
    partial += chunk;
    const size_t end = partial.rfind('\n');
    if (end == std::string::npos) {
      if (partial.size() > kMaxMetricsBytes) partial.clear();  // no row is that long
      return;
    }
    const Curve more = read_curve(partial.substr(0, end), metric);
    curve.insert(curve.end(), more.begin(), more.end());
    partial.erase(0, end + 1);
  }
};

// One running trial.
struct Child {
  pid_t pid = -1;
  size_t trial = 0;
  int slot = 0;
  bool stop_sent = false;  // SIGTERM sent: by the user's stop, or by early stopping
  bool stopped_early = false;
  int rung_judged = -1;  // asha: the highest rung already judged
  std::chrono::steady_clock::time_point started;
};

class SweepRunner {
 public:
  SweepRunner(SweepPlan plan, std::vector<TrialState> states, const SweepOptions& opts)
      : m_plan(std::move(plan)), m_states(std::move(states)), m_opts(opts) {
    m_states.resize(m_plan.trials.size());
    m_files.resize(m_plan.trials.size());
    m_curves.resize(m_plan.trials.size());
  }

  SweepResult run();

 private:
  fs::path trial_dir(size_t i) const { return fs::path(m_opts.out) / m_plan.trials[i].name; }
  void save() const { write_file_atomic((fs::path(m_opts.out) / "sweep.json").string(), sweep_json(m_plan, m_states)); }
  void start(size_t trial, int slot);
  void finished(Child& c, int status);
  void poll_early_stop();
  SweepResult tabulate(bool interrupted);

  SweepPlan m_plan;
  std::vector<TrialState> m_states;
  SweepOptions m_opts;
  std::vector<Child> m_running;
  std::vector<CurveFile> m_files;  // each trial's metrics.jsonl, followed for early stopping
  std::vector<Curve> m_curves;     // (the curves, as the rules take them)
  int m_threads = 1;
  int m_slots = 1;
  SweepResult m_result;
};

void SweepRunner::start(size_t i, int slot) {
  const SweepTrial& t = m_plan.trials[i];
  const fs::path dir = trial_dir(i);
  std::error_code ec;
  // A failed trial starts again from nothing; an interrupted one (or one whose sweep died) continues from its
  // checkpoints; without checkpoints it starts from nothing too (train refuses a folder with checkpoints and no
  // --resume, and a run's files of an earlier start would mix with the new ones). console.log keeps every start.
  const bool has_checkpoints = fs::is_directory(dir / "checkpoints", ec);
  const bool resume = has_checkpoints && m_states[i].status != TrialStatus::failed;
  if (!resume && fs::exists(dir, ec)) {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename() != "console.log") fs::remove_all(it->path(), ec);
  }
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the trial's folder: {}", dir.string(), ec.message()));
  if (!resume) write_manifest(dir.string(), Owner::run, {}, true);  // a run's folder, for the trial's train to take
  m_files[i] = {};                                                  // its metrics.jsonl is cut back or new

  std::vector<std::string> args = trial_train_args(m_plan, t, m_opts.out);
  args.insert(args.begin(), m_opts.exe);
  args.emplace_back("--no-progress");
  args.emplace_back("--threads");
  args.push_back(std::to_string(m_threads));
  if (resume) {
    args.emplace_back("--resume");
    args.emplace_back("auto");
  }
  std::vector<std::string> env;
  const bool gpu = !m_opts.devices.empty();
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (gpu && v.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) continue;
    if (v.rfind("OMP_NUM_THREADS=", 0) == 0 || v.rfind("OPENBLAS_NUM_THREADS=", 0) == 0) continue;
    env.emplace_back(v);
  }
  if (gpu) env.push_back(fmt::format("CUDA_VISIBLE_DEVICES={}", m_opts.devices[static_cast<size_t>(slot)]));
  env.push_back(fmt::format("OMP_NUM_THREADS={}", m_threads));  // a BLAS's own threads share the trial's cores too
  env.push_back(fmt::format("OPENBLAS_NUM_THREADS={}", m_threads));

  // The exact command, with the variables the sweep sets, so that a trial can be run again by hand.
  std::string command = fmt::format(
      "{}OMP_NUM_THREADS={} OPENBLAS_NUM_THREADS={}",
      gpu ? fmt::format("CUDA_VISIBLE_DEVICES={} ", m_opts.devices[static_cast<size_t>(slot)]) : std::string(),
      m_threads, m_threads);
  for (const std::string& a : args) {
    if (!command.empty()) command += ' ';
    command += shell_quote(a);
  }
  const fs::path log = dir / "console.log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", log.string(), std::strerror(errno)));
  const std::string header = fmt::format(
      "[{}] [sweep] start {} of trial {}{}: {}\n", now_stamp(), m_states[i].starts + 1, t.name,
      gpu ? fmt::format(" on CUDA device {}", m_opts.devices[static_cast<size_t>(slot)]) : std::string(), command);
  if (::write(fd, header.data(), header.size()) < 0) {
    // the header is informative; the trial's own output still goes there
  }

  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw Error(fmt::format("cannot start trial {}: fork: {}", t.name, std::strerror(errno)));
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec. Its own process group, so that a Ctrl-C on the terminal
    // reaches the sweep alone, which stops the trials itself; and a SIGTERM when the sweep dies (kill -9).
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(75);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "[sweep] cannot run the gputrain binary (execve failed)\n";
    if (::write(2, msg, sizeof msg - 1) < 0) {
    }
    ::_exit(127);
  }
  ::close(fd);
  m_states[i].status = TrialStatus::running;
  m_states[i].starts += 1;
  m_result.started += 1;
  Child c;
  c.pid = pid;
  c.trial = i;
  c.slot = slot;
  c.started = std::chrono::steady_clock::now();
  c.rung_judged = -1;
  m_running.push_back(c);
  save();
  spdlog::info("[sweep] start {}{}: {}{}", t.name, resume ? " (resumed from its checkpoint)" : "",
               gpu ? fmt::format("CUDA device {}", m_opts.devices[static_cast<size_t>(slot)])
                   : fmt::format("{} CPU thread{}", m_threads, m_threads == 1 ? "" : "s"),
               m_states[i].starts > 1 ? fmt::format(", start {}", m_states[i].starts) : std::string());
}

void SweepRunner::finished(Child& c, int status) {
  const size_t i = c.trial;
  const SweepTrial& t = m_plan.trials[i];
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.started).count();
  TrialState& s = m_states[i];
  // A trial the sweep sent SIGTERM to in its first moments (a stop right after it was started) can die of the
  // signal before its handlers are in place: it did nothing yet, and is stopped (or stopped early) as asked, not
  // failed; without checkpoints, --resume starts it from nothing.
  const bool stopped_at_start = c.stop_sent && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM;
  const bool stopped = code == 75 || stopped_at_start;
  s.exit_code = code;
  if (code == 0) {
    s.status = TrialStatus::completed;
    m_result.completed += 1;
    spdlog::info("[sweep] {} completed in {:.1f} s", t.name, seconds);
  } else if (stopped && c.stopped_early) {
    s.status = TrialStatus::stopped_early;
    m_result.stopped_early += 1;
    spdlog::info("[sweep] {} stopped early after {:.1f} s ({} rule on {})", t.name, seconds,
                 m_opts.early_stop.rule == EarlyStopRule::median ? "median" : "asha", m_opts.metric);
  } else if (stopped) {
    s.status = TrialStatus::interrupted;
    m_result.interrupted += 1;
    if (stopped_at_start)
      spdlog::info("[sweep] {} interrupted as it started (--resume starts it again)", t.name);
    else
      spdlog::info("[sweep] {} interrupted after {:.1f} s (its checkpoint is kept: --resume continues it)", t.name,
                   seconds);
  } else {
    s.status = TrialStatus::failed;
    m_result.failed += 1;
    // Reported at once: which trial, how it ended and the end of its output.
    const fs::path log = trial_dir(i) / "console.log";
    const std::string tail = last_lines(read_tail(log, 64 << 10).value_or(""), 10);
    std::string indented;
    for (size_t from = 0; from < tail.size();) {
      size_t end = tail.find('\n', from);
      if (end == std::string::npos) end = tail.size();
      indented += "    " + tail.substr(from, end - from) + "\n";
      from = end + 1;
    }
    fmt::print(stderr, "gputrain sweep: trial {} ({}) failed with exit code {}{}; the end of {}:\n{}", t.index, t.name,
               code, WIFSIGNALED(status) ? fmt::format(" (killed by signal {})", WTERMSIG(status)) : std::string(),
               log.string(), indented);
    std::fflush(stderr);
  }
  save();
}

void SweepRunner::poll_early_stop() {
  if (m_opts.early_stop.rule == EarlyStopRule::none) return;
  // Every trial's curve so far (finished ones too: the rules compare with them).
  for (size_t i = 0; i < m_plan.trials.size(); ++i) {
    m_files[i].update(trial_dir(i) / "metrics.jsonl", m_opts.metric);
    m_curves[i] = m_files[i].curve;
  }
  for (Child& c : m_running) {
    if (c.stop_sent) continue;
    bool stop = false;
    if (m_opts.early_stop.rule == EarlyStopRule::median) {
      stop = median_rule_stops(m_curves, c.trial, m_opts.early_stop);
    } else {
      const int rung = asha_rung(m_curves[c.trial], m_opts.early_stop);
      if (rung > c.rung_judged) {
        c.rung_judged = rung;
        stop = asha_stops(m_curves, c.trial, rung, m_opts.early_stop);
      }
    }
    if (!stop) continue;
    const CurvePoint& at = m_curves[c.trial].back();
    spdlog::info("[sweep] stopping {} early: {} {} at step {} is among the worse", m_plan.trials[c.trial].name,
                 m_opts.metric, at.value, at.step);
    c.stop_sent = true;
    c.stopped_early = true;
    ::kill(c.pid, SIGTERM);
  }
}

SweepResult SweepRunner::run() {
  m_slots = m_opts.devices.empty() ? std::max(m_opts.parallel, 1) : static_cast<int>(m_opts.devices.size());
  const int cores =
      m_opts.cores > 0 ? m_opts.cores : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  m_threads = std::max(1, cores / m_slots);
  // A curve of a trial finished before (a resumed sweep) counts for the early-stopping comparisons too.
  std::vector<size_t> queue;
  for (size_t i = 0; i < m_plan.trials.size(); ++i) {
    const TrialStatus s = m_states[i].status;
    if (s == TrialStatus::completed || s == TrialStatus::stopped_early) {
      m_result.skipped += 1;
      continue;
    }
    queue.push_back(i);
  }
  if (m_result.skipped)
    spdlog::info("[sweep] resuming: {} of {} trials are done, {} to run", m_result.skipped, m_plan.trials.size(),
                 queue.size());
  save();
  size_t next = 0;
  bool stopping = false;
  auto last_poll = std::chrono::steady_clock::now();
  while (next < queue.size() || !m_running.empty()) {
    if (const int sig = stop_requested(); sig && !stopping) {
      stopping = true;
      spdlog::info("[sweep] {}: stopping the {} running trial{} (each writes a checkpoint and exits 75)",
                   signal_name(sig), m_running.size(), m_running.size() == 1 ? "" : "s");
      for (Child& c : m_running) {
        if (!c.stop_sent) ::kill(c.pid, SIGTERM);
        c.stop_sent = true;
      }
    }
    if (stopping && next < queue.size() && m_running.empty()) break;
    while (!stopping && next < queue.size() && static_cast<int>(m_running.size()) < m_slots) {
      std::vector<bool> used(static_cast<size_t>(m_slots), false);
      for (const Child& c : m_running) used[static_cast<size_t>(c.slot)] = true;
      const int slot = static_cast<int>(std::find(used.begin(), used.end(), false) - used.begin());
      const size_t trial = queue[next++];
      try {
        start(trial, slot);
      } catch (const Error& e) {
        // A trial that cannot be started (its folder, fork) fails alone; the running ones go on.
        m_states[trial].status = TrialStatus::failed;
        m_result.failed += 1;
        fmt::print(stderr, "gputrain sweep: trial {} ({}) could not start: {}\n", trial, m_plan.trials[trial].name,
                   e.what());
        save();
      }
    }
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      const auto it = std::find_if(m_running.begin(), m_running.end(), [&](const Child& c) { return c.pid == pid; });
      if (it == m_running.end()) continue;
      Child c = *it;
      m_running.erase(it);
      finished(c, status);
    }
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_poll).count() >= m_opts.poll_seconds) {
      poll_early_stop();
      last_poll = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return tabulate(stopping);
}

SweepResult SweepRunner::tabulate(bool interrupted) {
  std::vector<RunInfo> runs;
  for (size_t i = 0; i < m_plan.trials.size(); ++i) {
    RunInfo r;
    r.dir = trial_dir(i).string();
    r.label = m_plan.trials[i].name;
    std::error_code ec;
    if (fs::is_directory(r.dir, ec)) read_run(r);
    if (!r.problem.empty()) spdlog::warn("{}: {}", r.dir, r.problem);
    // The sweep knows how a trial ended where its folder cannot say: stopped early (its summary says interrupted),
    // failed, or never started; a diverged trial keeps its own word.
    const TrialStatus s = m_states[i].status;
    if (s != TrialStatus::completed && !(s == TrialStatus::failed && r.status == "diverged"))
      r.status = trial_status_name(s);
    runs.push_back(std::move(r));
  }
  RunsTable table = runs_table(runs);
  std::vector<std::optional<double>> metric(m_plan.trials.size());
  const auto col = std::find(table.columns.begin(), table.columns.end(), m_opts.metric);
  if (col != table.columns.end()) {
    const size_t c = static_cast<size_t>(col - table.columns.begin());
    for (size_t i = 0; i < table.rows.size(); ++i)
      if (table.rows[i][c].kind == RunCell::Kind::number) metric[i] = table.rows[i][c].number;
    sort_runs(table, m_opts.metric, m_opts.maximize);
  } else {
    spdlog::warn("[sweep] no trial has {} in its summary.json: the table is in trial order", m_opts.metric);
  }
  m_result.table = runs_text(table);
  const fs::path out = m_opts.out;
  write_file_atomic((out / "sweep.csv").string(), runs_csv(table));
  write_file_atomic((out / "sweep.jsonl").string(), runs_jsonl(table));
  try {
    write_sweep_report(m_opts.out, m_plan, m_states, metric, m_opts.metric, m_opts.maximize);
  } catch (const Error& e) {
    spdlog::warn("[sweep] report.html: {}", e.what());
  }
  int failed = 0, pending = 0;
  for (const TrialState& s : m_states) {
    failed += s.status == TrialStatus::failed;
    pending += s.status == TrialStatus::pending || s.status == TrialStatus::interrupted;
  }
  m_result.exit_code = interrupted ? 75 : failed ? 1 : pending ? 1 : 0;
  return m_result;
}

}  // namespace

SweepResult run_sweep(
    SweepPlan plan, const SweepOptions& opts,
    const std::function<void(const std::string& config, const std::vector<std::string>& sets)>& validate) {
  if (opts.out.empty()) throw ConfigError("sweep: --out DIR is needed (the folder the trials' run directories go in)");
  const fs::path json_path = fs::path(opts.out) / "sweep.json";
  std::error_code ec;
  std::vector<TrialState> states;
  // Before anything else: a folder that is not this sweep's to write is refused first.
  check_output_folder("--out", opts.out, Owner::sweep, opts.resume ? Reuse::resume : Reuse::never,
                      "--resume continues it, or choose another --out");
  if (opts.resume) {
    const auto text = read_tail(json_path, size_t{16} << 20);
    if (!text)
      throw ConfigError(
          fmt::format("sweep --resume: no {} (nothing to resume; start it without --resume)", json_path.string()));
    auto loaded = read_sweep_json(*text, json_path.string());
    SweepPlan& stored = loaded.first;  // (a structured binding cannot be captured by the lambda below in C++20)
    // The plan is the stored one; flags given again must describe the same trials.
    if (!plan.trials.empty()) {
      auto same = [&] {
        if (stored.config != plan.config || stored.sets != plan.sets || stored.trials.size() != plan.trials.size())
          return false;
        for (size_t i = 0; i < plan.trials.size(); ++i)
          if (stored.trials[i].name != plan.trials[i].name || stored.trials[i].values != plan.trials[i].values)
            return false;
        return true;
      };
      if (!same())
        throw ConfigError(fmt::format(
            "sweep --resume: the config, --set values or axes differ from those {} records ({} trials of {}); resume "
            "with the same flags (or with CONFIG alone), or sweep into another --out",
            json_path.string(), stored.trials.size(), stored.config));
    }
    plan = std::move(stored);
    states = std::move(loaded.second);
  }
  // Every trial's config is checked before any starts: a typo in one value must not launch the others.
  for (const SweepTrial& t : plan.trials) {
    std::vector<std::string> sets = plan.sets;
    for (const std::string& o : t.overrides()) sets.push_back(o);
    try {
      validate(plan.config, sets);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("trial {} ({}): {}", t.index, t.name, e.what()));
    }
  }
  claim_output_folder("--out", opts.out, Owner::sweep, opts.resume ? Reuse::resume : Reuse::never,
                      "--resume continues it, or choose another --out");
  SweepOptions o = opts;
  if (o.exe.empty()) o.exe = "/proc/self/exe";
  // /proc/self/exe read now: the trials run this binary, even if the file is replaced meanwhile (a rebuild).
  if (o.exe == "/proc/self/exe") {
    const fs::path real = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) o.exe = real.string();
  }
  // One sweep at a time in a folder: a second (a --resume while the first still runs) would start its trials again.
  RunDirLock lock;
  lock.acquire(opts.out);
  SweepRunner runner(std::move(plan), std::move(states), o);
  return runner.run();
}

std::string write_slurm_script(const SweepPlan& plan, const std::string& out, int parallel, const std::string& exe) {
  std::error_code ec;
  claim_output_folder("--out", out, Owner::sweep, Reuse::never, "choose another --out");
  const std::string abs_out = fs::absolute(out, ec).lexically_normal().string();
  std::string cases;
  for (const SweepTrial& t : plan.trials) {
    std::string line = shell_quote(exe);
    for (const std::string& a : trial_train_args(plan, t, abs_out)) {
      line += ' ';
      line += shell_quote(a);
    }
    // --resume auto: a requeued or preempted task continues from its checkpoint (or starts, when there is none).
    cases += fmt::format("  {})\n    exec {} --no-progress --resume auto ;;\n", t.index, line);
  }
  const std::string name = fs::path(abs_out).filename().string();
  const std::string script = fmt::format(
      "#!/bin/bash\n"
      "# Written by `gputrain sweep --emit slurm`: one array task per trial of {} ({} trials). Submit with\n"
      "#   sbatch {}\n"
      "# then compare the trials with `gputrain runs {}`.\n"
      "#SBATCH --job-name={}\n"
      "#SBATCH --array=0-{}%{}\n"
      "#SBATCH --output={}/slurm-%A_%a.out\n"
      "#SBATCH --requeue\n"
      "set -euo pipefail\n"
      "case \"${{SLURM_ARRAY_TASK_ID:?not inside a Slurm array job}}\" in\n"
      "{}"
      "  *)\n    echo \"no trial $SLURM_ARRAY_TASK_ID in this sweep\" >&2\n    exit 2 ;;\n"
      "esac\n",
      shell_quote(plan.config), plan.trials.size(), shell_quote(abs_out + "/sweep.sbatch"), shell_quote(abs_out),
      shell_quote("sweep-" + name), plan.trials.size() - 1, std::max(parallel, 1), abs_out, cases);
  const std::string path = (fs::path(abs_out) / "sweep.sbatch").string();
  write_file_atomic(path, script);
  ::chmod(path.c_str(), 0755);
  write_file_atomic((fs::path(abs_out) / "sweep.json").string(), sweep_json(plan, {}));
  return path;
}

namespace {

// One scatter: the metric (y) against one swept key (x): numbers on a linear or log axis, other values as
// categories in the order first seen. Stopped trials are drawn hollow.
std::string svg_scatter(const std::string& key, bool log_axis, const std::vector<std::string>& xs,
                        const std::vector<double>& ys, const std::vector<bool>& hollow, const std::string& metric) {
  constexpr double W = 640, H = 300, L = 58, R = 16, T = 30, B = 44;  // as the line charts: one grid of charts
  bool numeric = true;
  for (const std::string& x : xs) numeric = numeric && finite_number(x) && (!log_axis || *finite_number(x) > 0);
  std::vector<std::string> categories;
  std::vector<double> xv;
  for (const std::string& x : xs) {
    if (numeric) {
      xv.push_back(log_axis ? std::log10(*finite_number(x)) : *finite_number(x));
    } else {
      auto it = std::find(categories.begin(), categories.end(), x);
      if (it == categories.end()) it = categories.insert(categories.end(), x);
      xv.push_back(static_cast<double>(it - categories.begin()));
    }
  }
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (size_t i = 0; i < xv.size(); ++i) {
    x0 = std::min(x0, xv[i]), x1 = std::max(x1, xv[i]), y0 = std::min(y0, ys[i]), y1 = std::max(y1, ys[i]);
  }
  if (!numeric) x0 -= 0.5, x1 += 0.5;
  if (x1 <= x0) x0 -= 1, x1 += 1;
  if (y1 <= y0) {
    const double pad = std::max(std::abs(y0) * 0.05, 1e-12);
    y0 -= pad, y1 += pad;
  }
  // A margin inside the frame, so that the extreme points are not drawn on it (the ticks give the data's range).
  const double ylo = y0, yhi = y1, xlo = x0, xhi = x1;
  y0 -= (yhi - ylo) * 0.06, y1 += (yhi - ylo) * 0.06;
  if (numeric) x0 -= (xhi - xlo) * 0.06, x1 += (xhi - xlo) * 0.06;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  const std::string title = fmt::format("{} against {}", metric, key);
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" data-key=\"{}\" viewBox=\"0 0 {} {}\" "
      "preserveAspectRatio=\"xMidYMid meet\" role=\"img\" aria-label=\"{}\">\n",
      html_escape(key), W, H, html_escape(title));
  out += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>\n", L, html_escape(title));
  const ChartAxis ya = nice_axis(ylo, yhi, 5);  // ticks and gridlines at round values inside the frame
  for (const double t : ya.ticks) {
    if (t < y0 || t > y1) continue;
    out +=
        fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{:.2f}\" x2=\"{}\" y2=\"{:.2f}\"/>\n", L, py(t), W - R, py(t));
    out += fmt::format("<text x=\"{}\" y=\"{:.2f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n", L - 6, py(t) + 4,
                       tick_label(t, ya.step));
  }
  out +=
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", L, T, W - L - R, H - T - B);
  auto x_label = [&](double x) {
    return log_axis ? fmt::format("{:.3g}", std::pow(10.0, x)) : fmt::format("{:.4g}", x);
  };
  if (numeric) {
    out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", px(xlo),
                       H - B + 16, x_label(xlo));
    out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", px(xhi),
                       H - B + 16, x_label(xhi));
  } else {
    for (size_t i = 0; i < categories.size(); ++i)
      out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n",
                         px(static_cast<double>(i)), H - B + 16, html_escape(categories[i]));
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}{}</text>\n", (L + W - R) / 2,
                     H - 8, html_escape(key), log_axis && numeric ? " (log scale)" : "");
  for (size_t i = 0; i < xv.size(); ++i)
    out += fmt::format(
        "<circle class=\"point\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"4\" fill=\"{}\" stroke=\"#1f77b4\"><title>{}={}: "
        "{:.6g}</title></circle>\n",
        px(xv[i]), py(ys[i]), hollow[i] ? "none" : "#1f77b4", html_escape(key), html_escape(xs[i]), ys[i]);
  return out + "</svg>\n";
}

// Every trial's training loss over its steps on one chart, coloured by the rank of its value of `axis` among the
// distinct ones (numbers by value, other values in the order first seen), so that a grid's values spread over the
// colour scale: how the curves part as the key changes, which the end metric alone does not show. "" when no trial
// has logged a row.
std::string trial_curves_chart(const std::string& out, const SweepPlan& plan, const SweepAxis& axis) {
  std::vector<std::string> values, seen;
  for (const SweepTrial& t : plan.trials) values.push_back(t.values.empty() ? "" : t.values.front().second);
  const bool numeric =
      std::all_of(values.begin(), values.end(), [](const std::string& v) { return finite_number(v).has_value(); });
  std::vector<double> key;
  for (const std::string& v : values) {
    if (numeric) {
      key.push_back(*finite_number(v));
      continue;
    }
    auto it = std::find(seen.begin(), seen.end(), v);
    if (it == seen.end()) it = seen.insert(seen.end(), v);
    key.push_back(static_cast<double>(it - seen.begin()));
  }
  std::vector<double> distinct = key;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<ChartSeries> curves;
  std::string lo_value, hi_value;
  for (size_t i = 0; i < plan.trials.size(); ++i) {
    const auto r = std::lower_bound(distinct.begin(), distinct.end(), key[i]) - distinct.begin();
    if (r == 0) lo_value = values[i];
    if (r + 1 == static_cast<std::ptrdiff_t>(distinct.size())) hi_value = values[i];
    ChartSeries s;
    s.label = plan.trials[i].name;
    s.color =
        scale_color(distinct.size() > 1 ? static_cast<double>(r) / static_cast<double>(distinct.size() - 1) : 0.5);
    s.points = read_metric_curve((fs::path(out) / plan.trials[i].name).string(), "train", "loss");
    if (!s.points.empty()) curves.push_back(std::move(s));
  }
  if (curves.empty()) return "";
  return svg_line_chart("trial_loss", "train loss of each trial", "step", curves, 0,
                        fmt::format("colour: {} from {} (dark) to {} (yellow)", axis.key, lo_value, hi_value));
}

}  // namespace

std::string write_sweep_report(const std::string& out, const SweepPlan& plan, const std::vector<TrialState>& states,
                               const std::vector<std::optional<double>>& metric, const std::string& metric_name,
                               bool maximize) {
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>gputrain sweep: {}</title>\n"
      "<style>\n{}</style>\n</head>\n<body>\n<h1>gputrain sweep: {}</h1>\n<p>{} trials of {}; {} ({}: {} is "
      "better). A hollow point is a trial stopped early (its metric when it stopped).</p>\n",
      html_escape(out), report_style(), html_escape(out), plan.trials.size(), html_escape(plan.config),
      html_escape(metric_name), maximize ? "max" : "min", maximize ? "higher" : "lower");
  std::vector<const SweepAxis*> axes;
  for (const auto* list : {&plan.grid, &plan.random})
    for (const SweepAxis& a : *list) axes.push_back(&a);
  html += "<div class=\"charts\">\n";
  for (size_t a = 0; a < axes.size(); ++a) {
    std::vector<std::string> xs;
    std::vector<double> ys;
    std::vector<bool> hollow;
    for (size_t i = 0; i < plan.trials.size(); ++i) {
      if (i >= metric.size() || !metric[i] || a >= plan.trials[i].values.size()) continue;
      xs.push_back(plan.trials[i].values[a].second);
      ys.push_back(*metric[i]);
      hollow.push_back(i < states.size() && states[i].status == TrialStatus::stopped_early);
    }
    if (xs.empty()) continue;
    bool log_axis = axes[a]->kind == SweepAxis::Kind::log_uniform;
    if (!log_axis) {  // a grid of positive numbers spanning 100x or more reads better on a log axis (lr 1e-4 … 1e-1)
      double lo = INFINITY, hi = 0;
      bool positive = true;
      for (const std::string& x : xs) {
        const auto v = finite_number(x);
        positive = positive && v && *v > 0;
        if (v) lo = std::min(lo, *v), hi = std::max(hi, *v);
      }
      log_axis = positive && hi >= 100 * lo;
    }
    html += svg_scatter(axes[a]->key, log_axis, xs, ys, hollow, metric_name);
  }
  if (!axes.empty()) html += trial_curves_chart(out, plan, *axes.front());
  html += "</div>\n<h2>Trials</h2>\n<table>\n";
  for (size_t i = 0; i < plan.trials.size(); ++i)
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", html_escape(plan.trials[i].name),
                        trial_status_name(i < states.size() ? states[i].status : TrialStatus::pending),
                        i < metric.size() && metric[i] ? shortest(*metric[i]) : "-");
  html += "</table>\n</body>\n</html>\n";
  const std::string path = (fs::path(out) / "report.html").string();
  write_file_atomic(path, html);
  return path;
}

}  // namespace gt
