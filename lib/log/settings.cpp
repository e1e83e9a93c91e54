// Reading and writing back the logging section; each unknown key or bad value names its path.
#include "log/settings.h"

#include "config/choice.h"

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

}  // namespace

const std::string& to_string(LogLevel level) { return choice_name(log_levels(), level); }
spdlog::level::level_enum spdlog_level(LogLevel level) { return choice_row(log_levels(), level).spdlog; }

void parse_logging(const ConfigNode& n, LoggingConfig& out, int64_t& log_every) {
  n.expect_keys({"every_steps", "tensorboard", "jsonl", "report", "level", "gpu_metrics", "interval_s", "progress"});
  if (n.has("every_steps")) log_every = n["every_steps"].as_size(1, limits::kInterval);
  out.tensorboard = n.get_bool("tensorboard", true);
  out.jsonl = n.get_bool("jsonl", true);
  out.report = n.get_bool("report", true);
  if (n.has("level")) out.level = parse_choice(n["level"], log_levels());
  out.gpu_metrics = n.get_bool("gpu_metrics", true);
  out.interval_s = n.get_double("interval_s", 1.0, 1e-3, 3600);
  out.progress = n.get_bool("progress", true);
}

YAML::Node to_yaml(const LoggingConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["tensorboard"] = c.tensorboard;
  n["jsonl"] = c.jsonl;
  n["report"] = c.report;
  n["level"] = to_string(c.level);
  n["gpu_metrics"] = c.gpu_metrics;
  n["interval_s"] = c.interval_s;
  n["progress"] = c.progress;
  return n;
}

}  // namespace gt
