// `gputrain sweep`'s plan (pure): the axes of --grid and --random, the trials they make, their tags and directory
// names, sweep.json written and read, and the command line of one trial.
#include "train/sweep.h"

#include "core/error.h"
#include "core/json.h"
#include "core/json_read.h"
#include "core/quote.h"
#include "train/runs.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>

namespace gt {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxTagBytes = 96;

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

}  // namespace gt
