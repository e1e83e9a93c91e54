// The `dist:` section: data-parallel settings, how they are read from the config and written back.
#pragma once

#include "config/config.h"
#include "config/schema.h"

#include <yaml-cpp/yaml.h>

namespace gt {

/// Data-parallel settings (used when a launcher starts several ranks).
struct DistConfig {
  double bucket_mb = 25;   ///< gradient bucket size for the overlapped all-reduce
  double timeout_s = 300;  ///< a collective waiting longer than this ends the run with exit 3
  bool overlap = true;     ///< all-reduce gradient buckets on a thread during backward
  int zero = 0;  ///< ZeRO stage: 1 shards the optimizer state, 2 also the averaged gradients, 3 also the weights
  /// dist.zero 3's unit of gathered parameters: "block" (each pass of a top-level `repeat:` block, and the runs of
  /// layers between them; the bucket_mb cut for a model without blocks) or "bucket" (the bucket_mb cut).
  std::string shard_unit = "block";
  /// "optimizer": the optimizer state and the master weights in page-locked host memory, the update on the CPU
  /// (optim/offload.h); "none": where the parameters are.
  std::string offload = "none";
  /// With offload: the host update of a step runs beside the next step's passes (OffloadOptimizer's `delayed`).
  bool offload_delay = false;
  bool sync_batchnorm = false;  ///< batch norm statistics over the global batch (one all-reduce per layer and pass)
};

/// The keys of the `dist:` section, their bounds and defaults (parse_dist reads by them).
const SectionSpec& dist_section();
/// Reads the `dist:` section; throws ConfigError naming the key.
void parse_dist(const ConfigNode& n, DistConfig& out);
/// The section after defaults, as config.resolved.yaml writes it.
YAML::Node to_yaml(const DistConfig& c);

}  // namespace gt
