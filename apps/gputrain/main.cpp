// gputrain: the command line. Parses, runs the one command parsed (cli.h: each registered with its function by the
// cmd_*.cpp file of its group), and is the only place that maps errors to exit codes.
#include "cli.h"

#include "core/backend.h"
#include "log/logging.h"
#include "ops/cpu/conv_algo.h"
#include "ops/cpu/isa.h"
#include "ops/epilogue.h"
#include "train/signals.h"

#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string_view>
#include <system_error>

// SIGINT, SIGTERM and SIGUSR1 are caught before any library initialiser runs: the executable's .preinit_array runs
// first of all, as soon as the dynamic loader has mapped and relocated the libraries (cuBLASLt's initialisers alone
// then take tens of milliseconds). A signal from there on is remembered and ends a training run the documented way
// (75, or 130); main gives every other command the default actions back. bench/signal_window.py measures what is left
// of the window (docs/files.md).
namespace {
void catch_stop_signals_early(int, char**, char**) { gt::install_stop_handlers(); }
}  // namespace
__attribute__((section(".preinit_array"),
               used)) static void (*const g_preinit_stop_handlers)(int, char**, char**) = catch_stop_signals_early;

namespace {

// A parse error, with how gputrain takes an override written as a flag (Lightning's --optimizer.lr=0.02).
int usage_error(const CLI::ParseError& e, int argc, char** argv) {
  std::cerr << "error: " << e.what() << "\n";
  for (int i = 1; i < argc; ++i) {
    const std::string_view w = argv[i];
    const size_t eq = w.find('=');
    if (w.rfind("--", 0) == 0 && eq != std::string_view::npos && w.find('.') < eq) {
      std::cerr << "an override is --set " << w.substr(2) << " (or " << w.substr(2) << " after CONFIG)\n";
      return 2;
    }
  }
  std::cerr << "Run with --help for usage.\n";
  return 2;
}

// GPUTRAIN_PARSE_ONLY=1: the command line is parsed (and a config's words resolved: CONFIG, then overrides) but nothing
// runs; the command path is printed. tests/docs_current.py checks every command the docs show this way.
int parse_only(const gt::cli::Command& command) {
  std::string path;
  for (const CLI::App* a = command.app; a->get_parent(); a = a->get_parent()) path = " " + a->get_name() + path;
  if (const CLI::Option* words = command.app->get_option_no_throw("config")) {
    gt::cli::ConfigArgs args;
    args.words = words->results();
    if (const CLI::Option* flag = command.app->get_option_no_throw("--config"); flag && flag->count())
      args.flag_file = flag->results().front();
    if (const CLI::Option* sets = command.app->get_option_no_throw("--set")) args.sets = sets->results();
    args.resolve();
  }
  std::cout << "gputrain" << path << "\n";
  return 0;
}

bool parse_only_requested() {
  const char* v = std::getenv("GPUTRAIN_PARSE_ONLY");
  return v && std::string_view(v) == "1";
}

int exit_code_of(const gt::Error& e) {
  switch (e.kind()) {
    case gt::ErrorKind::config: return 2;
    case gt::ErrorKind::distributed: return 3;
    case gt::ErrorKind::diverged: return 4;
    default: return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  gt::init_logging();
  CLI::App app{"gputrain — train neural networks from YAML experiment files on the CPU and NVIDIA GPUs.\n" +
               std::string(gt::cli::kExitCodes)};
  app.set_version_flag("--version", std::string("gputrain ") + GPUTRAIN_VERSION);
  app.require_subcommand(1);
  gt::cli::Commands commands;
  gt::cli::add_train_commands(app, commands);
  gt::cli::add_inspect_commands(app, commands);
  gt::cli::add_weights_commands(app, commands);
  gt::cli::add_runs_commands(app, commands);
  gt::cli::add_data_commands(app, commands);

  if (argc == 1) {  // bare `gputrain`: what it is and how to start, not an error
    std::cout << app.help() << "\nExamples:\n"
              << "  gputrain train configs/fashion_mnist_mlp.yaml optimizer.lr=0.05 --epochs 3\n"
              << "  gputrain check configs/gpt2_124m.yaml --json\n"
              << "  gputrain generate runs/gpt_bytes/20261204-101500 --prompt 'Once upon a time'\n";
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return usage_error(e, argc, argv);
  }
  const gt::cli::Command* command = commands.parsed();
  if (!command) {  // only a group was parsed: CLI11 requires one of its subcommands, so this is not reached
    std::cerr << "error: no command to run\nRun with --help for usage.\n";
    return 2;
  }
  if (parse_only_requested()) {
    try {
      return parse_only(*command);
    } catch (const gt::Error& e) {
      std::cerr << "error: " << e.what() << "\n";
      return exit_code_of(e);
    }
  }
  // A training run (or a sweep) keeps the handlers through its set-up: a signal while the data loads or the ranks
  // meet still ends it with 75 (or 130). Every other command gets the default actions back, and takes one that came
  // while it was parsed the default way now.
  if (!command->training) {
    const int pending = gt::stop_requested();
    gt::remove_stop_handlers();  // the ones .preinit_array installed
    if (pending) std::raise(pending);
  }
  gt::cli::Context ctx;
  // A failure is logged first, then the other ranks are ended (their abort would otherwise cut the message).
  auto fail = [&ctx](int code) {
    if (ctx.abort_ranks) ctx.abort_ranks(code);
    return code;
  };
  try {
    gt::cpu::env_cpu_isa();  // GPUTRAIN_CPU_ISA, read (or refused) here on the main thread, before any kernel runs
    gt::cpu::env_cpu_conv_algo();  // GPUTRAIN_CPU_CONV, likewise
    gt::cpu::env_cpu_fusion();     // GPUTRAIN_CPU_FUSE, likewise
    return command->run(ctx);
  } catch (const gt::Error& e) {
    spdlog::error("{}", e.what());
    return fail(exit_code_of(e));
  } catch (const std::bad_alloc&) {
    const std::string what = gt::AllocLabel::take_unwound();  // what it was for, when a label says it
    spdlog::error("{}", gt::host_out_of_memory(0, what.empty() ? "a buffer outside the tensors" : what));
    return fail(1);
  } catch (const std::system_error& e) {
    // A thread that could not start (its stack not mapped under an address-space limit, or no thread left): said as
    // an allocation that failed, naming what was being set up.
    if (e.code() == std::errc::resource_unavailable_try_again || e.code() == std::errc::not_enough_memory) {
      const std::string what = gt::AllocLabel::take_unwound();
      spdlog::error("{}",
                    gt::host_out_of_memory(0, what.empty() ? "a thread's stack" : "a thread's stack, for " + what));
    } else {
      spdlog::error("unexpected failure: {}", e.what());
    }
    return fail(1);
  } catch (const std::exception& e) {
    spdlog::error("unexpected failure: {}", e.what());
    return fail(1);
  }
}
