// The `logging:` section: where the numbers of a run go, how it is read from the config and written back.
#pragma once

#include "config/config.h"
#include "config/schema.h"

#include <spdlog/common.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

namespace gt {

/// The lowest level the console and train.log show.
enum class LogLevel { debug, info, warn, error };
/// logging.progress: the live bar `automatic`ally (a terminal, and not under a launcher), `always` or `never`.
enum class ProgressBarMode { automatic, always, never };
const std::string& to_string(ProgressBarMode mode);
const std::string& to_string(LogLevel level);
/// The spdlog level of `level`.
spdlog::level::level_enum spdlog_level(LogLevel level);

struct LoggingConfig {
  bool tensorboard = true;          ///< events.out.tfevents.* in the run directory
  bool jsonl = true;                ///< metrics.jsonl
  bool report = true;               ///< report.html at the end of the run
  LogLevel level = LogLevel::info;  ///< the console and train.log
  bool gpu_metrics = true;          ///< sample GPU utilisation and memory (NVML) while training
  double interval_s = 1.0;          ///< seconds between GPU samples
  /// A live progress bar instead of the periodic step lines on the console: auto draws it on a terminal, and not
  /// under mpirun, srun or torchrun (Open MPI gives ranks a pseudo-terminal even when its output is piped).
  ProgressBarMode progress = ProgressBarMode::automatic;
};

/// Reads the `logging:` section; throws ConfigError naming the key. logging.every_steps is train.log_every under
/// the name the other logging settings suggest: given, it is written to `log_every` (it wins over train's).
/// The keys of the `logging:` section, their bounds and defaults (parse_logging reads by them).
const SectionSpec& logging_section();
void parse_logging(const ConfigNode& n, LoggingConfig& out, int64_t& log_every);
/// The section after defaults, as config.resolved.yaml writes it (every_steps goes out as train.log_every).
YAML::Node to_yaml(const LoggingConfig& c);

}  // namespace gt
