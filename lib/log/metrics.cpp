// metrics.jsonl and the fan-out of metric rows to it and to TensorBoard.
#include "log/metrics.h"

#include "core/error.h"
#include "core/json.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace gt {

MetricsFile::MetricsFile(const std::string& path) : m_path(path) {
  if (m_path.empty()) return;
  m_fd = ::open(m_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (m_fd < 0) throw Error(fmt::format("{}: cannot open for writing: {}", m_path, std::strerror(errno)));
}

MetricsFile::~MetricsFile() {
  if (m_fd >= 0) ::close(m_fd);
}

uint64_t MetricsFile::bytes() const {
  if (m_fd < 0) return 0;
  const off_t end = ::lseek(m_fd, 0, SEEK_END);
  return end < 0 ? 0 : static_cast<uint64_t>(end);
}

void MetricsFile::truncate(uint64_t bytes) {
  if (m_fd >= 0 && ::ftruncate(m_fd, static_cast<off_t>(bytes)) != 0)
    throw Error(fmt::format("{}: cannot truncate: {}", m_path, std::strerror(errno)));
}

void MetricsFile::write(const JsonObject& obj) {
  if (m_fd < 0) return;
  const std::string line = obj.str() + "\n";
  const uint64_t before = bytes();
  for (size_t done = 0; done < line.size();) {
    const ssize_t w = ::write(m_fd, line.data() + done, line.size() - done);  // O_APPEND
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      // A full disk takes part of a row, then nothing: the part is cut off again, so that the file stays whole
      // rows (what a reader and a resume rely on).
      const int err = w < 0 ? errno : ENOSPC;
      const bool cut = ::ftruncate(m_fd, static_cast<off_t>(before)) == 0;
      throw Error(fmt::format("{}: write failed: {}{}", m_path, std::strerror(err),
                              cut || done == 0 ? "" : " (half a row is left at its end)"));
    }
    done += static_cast<size_t>(w);
  }
}

std::string tensorboard_tag(const std::string& row_type, const std::string& field) {
  if (row_type == "train") {
    for (const char* f : {"loss", "lr", "grad_norm", "samples_per_sec", "data_wait_ms", "device_mem_mib",
                          "device_peak_mib", "loss_scale", "overflow_skips"})
      if (field == f) return "train/" + field;
    // Another rank's sampler fields: rank1_gpu1_util → rank1/gpu1/util, rank1_host_rss_mib → rank1/host/rss_mib.
    if (field.rfind("rank", 0) == 0) {
      const size_t cut = field.find('_');
      if (cut != std::string::npos && cut > 4 && field.find_first_not_of("0123456789", 4) == cut) {
        const std::string inner = tensorboard_tag(row_type, field.substr(cut + 1));
        if (inner.rfind("gpu", 0) == 0 || inner.rfind("host/", 0) == 0) return field.substr(0, cut) + "/" + inner;
      }
      return "";
    }
    // The sampler's fields (gpu_monitor.h): gpu0_util → gpu0/util, host_rss_mib → host/rss_mib.
    if (field.rfind("gpu", 0) == 0 || field.rfind("host_", 0) == 0) {
      const size_t cut = field.find('_');
      if (cut != std::string::npos) return field.substr(0, cut) + "/" + field.substr(cut + 1);
    }
  } else if (row_type == "eval") {
    if (field == "test_loss") return "test/loss";
    if (field == "test_accuracy") return "test/accuracy";
  }
  return "";
}

MetricsSink::MetricsSink(const std::string& dir, bool jsonl, bool tensorboard)
    : m_jsonl(dir.empty() || !jsonl ? std::string() : (std::filesystem::path(dir) / "metrics.jsonl").string()) {
  if (!dir.empty() && tensorboard) m_tb = std::make_unique<TensorBoardWriter>(dir);
}

void MetricsSink::write(const JsonObject& row) {
  m_jsonl.write(row);
  if (!m_tb) return;
  const std::string type = row.string_field("type");
  int64_t step = -1;
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [field, v] : row.numbers()) {
    if (field == "step") step = static_cast<int64_t>(v);
    if (std::string tag = tensorboard_tag(type, field); !tag.empty()) scalars.emplace_back(std::move(tag), v);
  }
  if (step >= 0 && !scalars.empty()) m_tb->write_scalars(step, scalars);
}

}  // namespace gt
