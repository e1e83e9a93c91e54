// Reading and writing back the logging section; each unknown key or bad value names its path.
#include "log/settings.h"

#include "config/choice.h"
#include "config/schema.h"

#include <array>

namespace gt {
namespace {

struct LevelRow {
  LogLevel value;
  std::string name;
  spdlog::level::level_enum spdlog;
};

const std::array<LevelRow, 4>& log_levels() {
  static const std::array<LevelRow, 4> table{{
      {LogLevel::debug, "debug", spdlog::level::debug},
      {LogLevel::info, "info", spdlog::level::info},
      {LogLevel::warn, "warn", spdlog::level::warn},
      {LogLevel::error, "error", spdlog::level::err},
  }};
  return table;
}

const std::array<Choice<ProgressBarMode>, 3>& progress_modes() {
  static const std::array<Choice<ProgressBarMode>, 3> table{{
      {ProgressBarMode::automatic, "auto"},
      {ProgressBarMode::always, "true"},
      {ProgressBarMode::never, "false"},
  }};
  return table;
}

}  // namespace

const std::string& to_string(ProgressBarMode mode) { return choice_name(progress_modes(), mode); }

const std::string& to_string(LogLevel level) { return choice_name(log_levels(), level); }
spdlog::level::level_enum spdlog_level(LogLevel level) { return choice_row(log_levels(), level).spdlog; }

const SectionSpec& logging_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "every_steps",
           .kind = KeyKind::size,
           .min = 1,
           .limit = &limits::kInterval,
           .doc = "another name for train.log_every; when given it wins"},
          {.name = "tensorboard",
           .kind = KeyKind::boolean,
           .fallback = "true",
           .doc = "write the TensorBoard events file"},
          {.name = "jsonl", .kind = KeyKind::boolean, .fallback = "true", .doc = "write metrics.jsonl"},
          {.name = "report",
           .kind = KeyKind::boolean,
           .fallback = "true",
           .doc = "write report.html when the run ends"},
          {.name = "level",
           .kind = KeyKind::choice,
           .choices = choice_names(log_levels()),
           .fallback = "info",
           .doc = "the console and train.log"},
          {.name = "gpu_metrics",
           .kind = KeyKind::boolean,
           .fallback = "true",
           .doc = "sample GPU utilisation and memory (NVML) while training on a GPU"},
          {.name = "interval_s",
           .kind = KeyKind::number,
           .min = 1e-3,
           .max = 3600,
           .fallback = "1",
           .doc = "seconds between GPU samples"},
          {.name = "progress",
           .kind = KeyKind::choice,
           .choices = {"auto", "true", "false"},
           .fallback = "auto",
           .doc = "the live progress bar instead of step lines: auto on a terminal and not under mpirun, srun or "
                  "torchrun; true always; false never"},
      },
      "what a run logs and writes");
  return s;
}

void parse_logging(const ConfigNode& n, LoggingConfig& out, int64_t& log_every) {
  const std::vector<KeySpec>& keys = section_keys(logging_section());
  auto key = [&](const char* name) -> const KeySpec& { return key_spec(keys, name); };
  expect_keys(n, keys);
  if (n.has("every_steps")) log_every = read_size(n["every_steps"], key("every_steps"));
  out.tensorboard = get_bool(n, key("tensorboard"));
  out.jsonl = get_bool(n, key("jsonl"));
  out.report = get_bool(n, key("report"));
  if (n.has("level")) out.level = parse_choice(n["level"], log_levels());
  out.gpu_metrics = get_bool(n, key("gpu_metrics"));
  out.interval_s = get_double(n, key("interval_s"));
  if (n.has("progress")) out.progress = parse_choice(n["progress"], progress_modes());
}

YAML::Node to_yaml(const LoggingConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["tensorboard"] = c.tensorboard;
  n["jsonl"] = c.jsonl;
  n["report"] = c.report;
  n["level"] = to_string(c.level);
  n["gpu_metrics"] = c.gpu_metrics;
  n["interval_s"] = c.interval_s;
  if (c.progress == ProgressBarMode::automatic)
    n["progress"] = "auto";
  else
    n["progress"] = c.progress == ProgressBarMode::always;
  return n;
}

}  // namespace gt
