// Reading and writing back the dist section; each unknown key or bad value names its path.
#include "dist/settings.h"

namespace gt {

void parse_dist(const ConfigNode& n, DistConfig& out) {
  n.expect_keys({"bucket_mb", "timeout_s", "overlap", "sync_batchnorm"});
  out.sync_batchnorm = n.get_bool("sync_batchnorm", false);
  // Synchronised batch norm all-reduces on the training thread during backward; the gradient buckets' all-reduces
  // on the communication thread would then race it for the same communicator (and their order could differ
  // between ranks), so it all-reduces the buckets after backward instead.
  if (out.sync_batchnorm && n.has("overlap") && n.get_bool("overlap", false))
    n["overlap"].fail(
        "dist.overlap cannot be true with dist.sync_batchnorm (batch norm's all-reduces run during "
        "backward); leave it out or set it false");
  out.overlap = n.get_bool("overlap", !out.sync_batchnorm);
  out.bucket_mb = n.get_double("bucket_mb", 25, 1e-3, 1e6);
  out.timeout_s = n.get_double("timeout_s", 300, 0.1, 1e7);
}

YAML::Node to_yaml(const DistConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  n["bucket_mb"] = c.bucket_mb;
  n["timeout_s"] = c.timeout_s;
  n["overlap"] = c.overlap;
  n["sync_batchnorm"] = c.sync_batchnorm;
  return n;
}

}  // namespace gt
