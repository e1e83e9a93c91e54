// The live progress display: formatting a bar line to a width, and drawing it through the console sink.
#include "log/progress.h"

#include "log/gpu_monitor.h"
#include "log/logging.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace gt {
namespace {

constexpr int kMinBar = 10, kMaxBar = 40;  // cells; wider bars say nothing more

// Columns of a UTF-8 string whose characters are all one column wide (ASCII and the block elements): its code
// points, i.e. the bytes that are not continuation bytes.
int columns(const std::string& s) {
  int n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// The first `n` columns of `s`, never cutting a character in two.
std::string first_columns(const std::string& s, int n) {
  size_t end = 0;
  for (int seen = 0; end < s.size(); ++end)
    if ((static_cast<unsigned char>(s[end]) & 0xC0) != 0x80 && seen++ == n) break;
  return s.substr(0, end);
}

// `cells` wide, `frac` of it filled, to an eighth of a cell.
std::string bar(double frac, int cells) {
  static const std::array<const char*, 8> kEighths = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  const int eighths = std::clamp(static_cast<int>(std::floor(frac * cells * 8)), 0, cells * 8);
  std::string out;
  int used = 0;
  for (; used < eighths / 8; ++used) out += "█";
  if (eighths % 8) {
    out += kEighths[static_cast<size_t>(eighths % 8)];
    ++used;
  }
  return out + std::string(static_cast<size_t>(cells - used), ' ');
}

}  // namespace

std::string format_hms(double seconds) {
  const auto t = static_cast<int64_t>(std::isfinite(seconds) ? std::max(seconds, 0.0) + 0.5 : 0.0);
  return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
}

std::string format_progress(const ProgressState& s, int width) {
  const double frac =
      s.steps > 0 ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.steps), 0.0, 1.0) : 0.0;
  // 100% only when the epoch is complete, not when 99.6% rounds up.
  const int pct = s.steps > 0 && s.step >= s.steps ? 100 : std::min(99, static_cast<int>(frac * 100));
  const std::string head = fmt::format("epoch {}/{} {:3}%", s.epoch, s.epochs, pct);
  const std::string count = fmt::format(" {}/{}", s.step, s.steps);

  enum Field : size_t { kLoss, kRate, kGpu, kElapsed, kEta, kFields, kBar = kFields };
  std::array<std::string, kFields> fields;
  if (s.loss) fields[kLoss] = fmt::format("loss {:.4f}", *s.loss);
  if (s.samples_per_sec) fields[kRate] = fmt::format("{:.0f} samples/s", *s.samples_per_sec);
  fields[kGpu] = s.gpu;
  fields[kElapsed] = "elapsed " + format_hms(s.elapsed_s);
  if (s.eta_s && !s.done) fields[kEta] = "eta " + format_hms(*s.eta_s);
  // What goes first when the line is too long. The percentage and the count say what the bar says, so the loss
  // and the eta outlast it; while the epoch runs its eta matters more than the time so far, and on its final line
  // the time is what is left to say.
  const std::vector<Field> drop = s.done ? std::vector<Field>{kGpu, kRate, kBar, kElapsed, kLoss}
                                         : std::vector<Field>{kElapsed, kGpu, kRate, kBar, kEta, kLoss};

  auto compose = [&](int cells) {
    std::string out = head;
    if (cells > 0) {  // appended piece by piece: "|" + bar + "|" trips GCC 12's false -Wrestrict
      out += '|';
      out += bar(frac, cells);
      out += '|';
    }
    out += count;
    for (const auto& f : fields)
      if (!f.empty()) out += " | " + f;
    return out;
  };
  bool with_bar = true;
  for (const Field f : drop) {
    const int rest = columns(compose(0));
    if (with_bar && rest + 2 + kMinBar <= width) return compose(std::min(kMaxBar, width - rest - 2));
    if (!with_bar && rest <= width) return compose(0);
    if (f == kBar)
      with_bar = false;
    else
      fields[f].clear();
  }
  // Only the epoch, its percentage and the count are left: cut at the width when even they do not fit.
  return first_columns(compose(0), std::max(width, 0));
}

std::string progress_gpu_text(const MonitorSample& s) {
  std::string out;
  for (const auto& g : s.gpus) {
    if (!out.empty()) out += " ";
    out += fmt::format("gpu{} {}", g.ordinal, g.util_pct ? fmt::format("{:.0f}%", *g.util_pct) : "?%");
    if (g.mem_used_mib && g.mem_total_mib)
      out += fmt::format(" {:.1f}/{:.1f} GiB", *g.mem_used_mib / 1024, *g.mem_total_mib / 1024);
  }
  return out;
}

bool console_is_live() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) == 1 && !(term && std::strcmp(term, "dumb") == 0);
}

int console_width() {
  winsize ws{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c && std::atoi(c) > 0) return std::atoi(c);
  return 80;
}

ProgressDisplay::ProgressDisplay() { console_set_live(true); }

ProgressDisplay::~ProgressDisplay() {
  console_keep_live();
  console_set_live(false);
}

bool ProgressDisplay::due() const {
  return std::chrono::steady_clock::now() - m_last_draw >= std::chrono::milliseconds(100);
}

// One column less than the terminal: a line that fills the last column leaves some terminals waiting to wrap,
// and the next carriage return would then land on a new line.
void ProgressDisplay::show(const ProgressState& s) {
  console_live_line(format_progress(s, console_width() - 1));
  m_last_draw = std::chrono::steady_clock::now();
}

void ProgressDisplay::finish(const ProgressState& s) {
  console_keep_live(format_progress(s, console_width() - 1));
  m_last_draw = {};  // the next epoch's bar shows at once
}

}  // namespace gt
