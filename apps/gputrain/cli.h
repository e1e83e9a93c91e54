// The command line's parts. main.cpp parses and maps errors to exit codes; each cmd_*.cpp file registers its
// commands here, each with the function that runs it, and shares the config arguments and helpers below. Adding a
// command: a function in the cmd_*.cpp of its group, registered with Commands::add (docs/CONTRIBUTING.md).
#pragma once

#include "flag_checks.h"

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gt {
class Model;
struct Experiment;
struct LoadedData;
}  // namespace gt

namespace gt::cli {

inline constexpr const char* kExitCodes =
    "Exit codes: 0 completed; 1 runtime error (I/O, data, device); 2 config or usage error; 3 distributed failure or "
    "timeout; 4 training diverged (non-finite loss or gradient); 75 interrupted by SIGINT/SIGTERM/SIGUSR1 after "
    "writing a checkpoint (resumable: the last line says how); 130 a second Ctrl-C (the last complete checkpoint is "
    "kept).";

/// What a running command may leave for main.
struct Context {
  /// Set by a command whose ranks must end together: main calls it with the exit code of a failure, after the
  /// message is logged (a communicator's abort).
  std::function<void(int)> abort_ranks;
};

/// A registered command: its CLI11 subcommand and the function that runs it.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(Context&)> run;
  bool training = false;  ///< keeps the stop-signal handlers through its set-up (train, sweep)
  int depth = 0;          ///< subcommands below the top (`export llmc` is 2)
};

/// Every subcommand is made here with the function that runs it, so that no parsed command goes unrun and no
/// function runs without its command; groups (config, data, import) only choose one of theirs.
class Commands {
 public:
  CLI::App* add(CLI::App& parent, const std::string& name, const std::string& help, std::function<int(Context&)> run,
                bool training = false);
  /// A command whose flags fill an Args that `run` reads (`run(args)` or `run(args, context)`):
  /// `auto [cmd, args] = commands.add_with<CheckArgs>(app, "check", "…", check);` then `cmd->add_option(…, args->x)`.
  /// The Args lives as long as the command.
  template <class Args, class Run>
  std::pair<CLI::App*, Args*> add_with(CLI::App& parent, const std::string& name, const std::string& help, Run run,
                                       bool training = false) {
    auto args = std::make_shared<Args>();
    CLI::App* app = add(
        parent, name, help,
        [args, run](Context& ctx) {
          if constexpr (std::is_invocable_v<Run, Args&, Context&>)
            return run(*args, ctx);
          else
            return run(*args);
        },
        training);
    return {app, args.get()};
  }
  CLI::App* group(CLI::App& parent, const std::string& name, const std::string& help);
  /// The parsed command deepest in the tree (`export llmc` over `export`); null before a successful parse.
  const Command* parsed() const;

 private:
  std::vector<Command> m_commands;
};

/// The config a command reads, as people type it: CONFIG (an experiment file, or a run directory, whose
/// config.resolved.yaml is read) or --config FILE, then overrides as --set KEY=VALUE or bare KEY=VALUE words
/// (Hydra's way; +KEY=, ++KEY= and ~KEY too). resolve() turns the words into `file`, `sets` and `run_dir`.
struct ConfigArgs {
  std::vector<std::string> words;  ///< the positional words: CONFIG (unless --config), then overrides
  std::string flag_file;           ///< --config FILE
  std::string file;
  std::vector<std::string> sets;
  std::string run_dir;  ///< CONFIG named a run directory: its weights are the default --checkpoint
  /// Throws ConfigError for no config, two configs, or a word that is not an override (`--set KEY VALUE`).
  void resolve();
  /// `weights` as given, else the run directory CONFIG named; ConfigError when there is neither.
  std::string weights_or_run(const std::string& weights) const;
};
void add_config_args(CLI::App* cmd, ConfigArgs& a);

/// Commands whose stdout is YAML, JSON or CSV: the log goes to stderr, warnings and errors only, so stdout is only
/// the machine output whatever the inputs are.
void quiet_log_for_machine_output();

/// The model `exp` describes, checked against its data (batch size, recompute, the loss against the output). Shapes
/// only: no parameter is created, so a model too large for this machine is still sized, not allocated.
Model checked_model(const Experiment& exp, const LoadedData& data);

// The command groups, one file each.
void add_train_commands(CLI::App& app, Commands& commands);    ///< train, sweep (cmd_train.cpp)
void add_inspect_commands(CLI::App& app, Commands& commands);  ///< check, config, devices, layers (cmd_inspect.cpp)
void add_data_commands(CLI::App& app, Commands& commands);     ///< data inspect, tokenize (cmd_data.cpp)
void add_weights_commands(CLI::App& app, Commands& commands);  ///< eval, generate, export, import (cmd_weights.cpp)
void add_runs_commands(CLI::App& app, Commands& commands);     ///< runs, report (cmd_runs.cpp)

}  // namespace gt::cli
