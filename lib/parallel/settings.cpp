// Reading and writing back the dist section; each unknown key or bad value names its path.
#include "parallel/settings.h"

namespace gt {

const SectionSpec& dist_section() {
  static const SectionSpec s = plain_section(
      {
          {.name = "bucket_mb",
           .kind = KeyKind::number,
           .min = 1e-3,
           .max = 1e6,
           .fallback = "25",
           .doc = "gradient bucket size of data-parallel runs, in MB"},
          {.name = "timeout_s",
           .kind = KeyKind::number,
           .min = 0.1,
           .max = 1e7,
           .fallback = "300",
           .doc = "a rank waiting longer than this in a collective ends the job with exit 3"},
          {.name = "overlap",
           .kind = KeyKind::boolean,
           .doc = "all-reduce gradient buckets during backward; default true, false with sync_batchnorm (which it "
                  "cannot go with)"},
          {.name = "zero",
           .kind = KeyKind::integer,
           .min = 0,
           .max = 3,
           .fallback = "0",
           .doc = "ZeRO stage: 0 every rank keeps the whole optimizer state; 1 each rank keeps and updates its "
                  "1/N shard of it and the new weights are all-gathered; 2 also reduce-scatters the gradients "
                  "instead of all-reducing them; 3 also keeps only its 1/N of the weights, each unit of them "
                  "(dist.shard_unit) all-gathered right before a pass uses it and freed after (CPU ranks: threads, "
                  "MPI, TCP; GPU ranks: NCCL)"},
          {.name = "shard_unit",
           .kind = KeyKind::choice,
           .choices = {"block", "bucket"},
           .fallback = "block",
           .doc = "dist.zero 3's unit of parameters gathered at once: block, each pass of a top-level repeat: "
                  "block and each run of layers between them (the bucket cut for a model without blocks); bucket, "
                  "the gradient buckets of dist.bucket_mb"},
          {.name = "offload",
           .kind = KeyKind::choice,
           .choices = {"none", "optimizer"},
           .fallback = "none",
           .doc = "optimizer: keep the optimizer state and fp32 master weights in page-locked host memory and run "
                  "the update on the CPU (ZeRO-Offload), so a GPU holds only the weights and gradients; with "
                  "dist.zero each rank offloads its shard; on the CPU it changes nothing but adds copies"},
          {.name = "offload_delay",
           .kind = KeyKind::boolean,
           .fallback = "false",
           .doc = "with offload: optimizer, run each step's host update beside the next step's forward and backward "
                  "passes, which then use weights one update behind (DeepSpeed's delayed parameter update): faster "
                  "on a GPU, not the same training; opt-in"},
          {.name = "sync_batchnorm",
           .kind = KeyKind::boolean,
           .fallback = "false",
           .doc = "batch norm over the global batch of all ranks"},
      },
      "data-parallel training");
  return s;
}

void parse_dist(const ConfigNode& n, DistConfig& out) {
  const std::vector<KeySpec>& keys = section_keys(dist_section());
  expect_keys(n, keys);
  out.sync_batchnorm = get_bool(n, key_spec(keys, "sync_batchnorm"));
  // Synchronised batch norm all-reduces on the training thread during backward; the gradient buckets' all-reduces
  // on the communication thread would then race it for the same communicator (and their order could differ
  // between ranks), so it all-reduces the buckets after backward instead.
  if (out.sync_batchnorm && n.has("overlap") && n.get_bool("overlap", false))
    n["overlap"].fail(
        "dist.overlap cannot be true with dist.sync_batchnorm (batch norm's all-reduces run during "
        "backward); leave it out or set it false");
  out.overlap = n.get_bool("overlap", !out.sync_batchnorm);
  out.bucket_mb = get_double(n, key_spec(keys, "bucket_mb"));
  out.timeout_s = get_double(n, key_spec(keys, "timeout_s"));
  out.zero = static_cast<int>(get_int(n, key_spec(keys, "zero")));
  out.shard_unit = n.get_choice("shard_unit", "block", {"block", "bucket"});
  out.offload = n.get_choice("offload", "none", {"none", "optimizer"});
  out.offload_delay = get_bool(n, key_spec(keys, "offload_delay"));
  if (out.offload_delay && out.offload != "optimizer")
    n["offload_delay"].fail("dist.offload_delay delays the host's update: it needs dist.offload: optimizer");
}

YAML::Node to_yaml(const DistConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["bucket_mb"] = c.bucket_mb;
  n["timeout_s"] = c.timeout_s;
  n["overlap"] = c.overlap;
  n["zero"] = c.zero;
  n["shard_unit"] = c.shard_unit;
  n["offload"] = c.offload;
  n["offload_delay"] = c.offload_delay;
  n["sync_batchnorm"] = c.sync_batchnorm;
  return n;
}

}  // namespace gt
