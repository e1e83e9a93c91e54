// The command table, the config arguments and the helpers the commands share.
#include "cli.h"

#include "core/quote.h"
#include "graph/model.h"
#include "log/logging.h"
#include "train/loss.h"
#include "train/setup.h"

#include <spdlog/spdlog.h>

#include <filesystem>

namespace gt::cli {

CLI::App* Commands::add(CLI::App& parent, const std::string& name, const std::string& help,
                        std::function<int(Context&)> run, bool training) {
  CLI::App* app = parent.add_subcommand(name, help);
  int depth = 1;
  for (const CLI::App* p = &parent; p->get_parent(); p = p->get_parent()) ++depth;
  m_commands.push_back({app, std::move(run), training, depth});
  return app;
}

CLI::App* Commands::group(CLI::App& parent, const std::string& name, const std::string& help) {
  CLI::App* app = parent.add_subcommand(name, help);
  app->require_subcommand(1);
  return app;
}

const Command* Commands::parsed() const {
  const Command* found = nullptr;
  for (const Command& c : m_commands)
    if (c.app->parsed() && (!found || c.depth > found->depth)) found = &c;
  return found;
}

namespace {

bool is_override_word(const std::string& w) { return !w.empty() && (w[0] == '~' || w.find('=') != std::string::npos); }

}  // namespace

void ConfigArgs::resolve() {
  namespace fs = std::filesystem;
  size_t first = 0;
  if (!flag_file.empty()) {
    file = flag_file;
  } else if (!words.empty() && !is_override_word(words[0])) {
    file = words[0];
    first = 1;
  } else {
    throw ConfigError("a config is needed: CONFIG (an experiment file or a run directory) or --config FILE");
  }
  for (size_t i = first; i < words.size(); ++i) {
    // `--set KEY VALUE`: the value arrived as a word of its own.
    for (const std::string& s : sets)
      if (!is_override_word(s) && !is_override_word(words[i]))
        throw ConfigError(fmt::format("--set {} {}: write --set {}={}", s, words[i], s, words[i]));
    if (!is_override_word(words[i]))
      throw ConfigError(fmt::format("{}: not an override (KEY=VALUE, +KEY=VALUE, ++KEY=VALUE or ~KEY){}",
                                    quote_value(words[i]),
                                    i == first && first == 0 ? "" : "; only one config may be given"));
    sets.push_back(words[i]);  // after the --set values, in the order typed
  }
  std::error_code ec;
  if (fs::is_directory(file, ec) && fs::exists(fs::path(file) / "config.resolved.yaml", ec)) {
    run_dir = file;
    file = (fs::path(file) / "config.resolved.yaml").string();
  }
}

std::string ConfigArgs::weights_or_run(const std::string& weights) const {
  if (!weights.empty()) return weights;
  if (run_dir.empty())
    throw ConfigError("--checkpoint PATH is needed (the weights), or give a run directory as CONFIG");
  return run_dir;
}

void add_config_args(CLI::App* cmd, ConfigArgs& a) {
  cmd->add_option("config", a.words,
                  "CONFIG: an experiment YAML file, or a run directory (its config.resolved.yaml), then overrides "
                  "KEY=VALUE as --set takes them")
      ->type_name("CONFIG [KEY=VALUE...]")
      ->check(non_empty("an experiment YAML file or a run directory"));
  cmd->add_option("--config", a.flag_file, "the experiment file (instead of the first word)")
      ->type_name("FILE")
      ->check(non_empty("an experiment YAML file"));
  cmd->add_option("--set", a.sets,
                  "override a key: --set optimizer.lr=0.1 --set model.layers[1].out_features=1024; +KEY=VALUE adds a "
                  "key the config lacks, ++KEY=VALUE sets it either way, ~KEY removes one")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
}

void quiet_log_for_machine_output() {
  log_console_to_stderr();
  spdlog::set_level(spdlog::level::warn);
}

Model checked_model(const Experiment& exp, const LoadedData& data) {
  Model model = Model::build(exp.model, data.train.input_shape(), DType::f32, Device::cpu(), exp.seed,
                             /*init_params=*/false);
  model.check_batch(exp.data.batch_size, exp.at.batch_size);
  apply_freeze(exp, model);
  apply_recompute(exp, model);
  check_graph_layers(exp, model);
  check_loss_fits(exp.loss, model.output_shape(), data.train, exp.at.loss, &data.test);
  return model;
}

}  // namespace gt::cli
