// The live progress display of `gputrain train` on a terminal: one bar per epoch, redrawn in place.
#pragma once

#include "core/noncopyable.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace gt {

struct MonitorSample;

/// What one progress line shows.
struct ProgressState {
  int64_t epoch = 1, epochs = 1;          ///< 1-based
  int64_t step = 0, steps = 0;            ///< optimizer steps done in this epoch, of the epoch's steps
  std::optional<double> loss;             ///< the epoch's mean training loss so far
  std::optional<double> samples_per_sec;  ///< over the epoch so far
  std::string gpu;                        ///< progress_gpu_text(); "" without a GPU
  double elapsed_s = 0;                   ///< since the run started
  std::optional<double> eta_s;            ///< to the end of the run; not shown on a finished epoch's line
  bool done = false;                      ///< the epoch's final line
};

/// The line for `s`, never wider than `width` columns (every character it uses is one column wide):
/// "epoch 2/5  45%|████▌     | 212/469 | loss 0.5123 | 23456 samples/s | gpu0 97% 3.2/80.0 GiB | elapsed 0:00:12 |
/// eta 0:00:40". When the width is short, parts go in this order: elapsed, gpu, samples/s, the bar, eta, loss (on a
/// finished epoch's line, which has no eta: gpu, samples/s, the bar, elapsed, loss).
std::string format_progress(const ProgressState& s, int width);

/// Seconds as H:MM:SS, the form of the log lines' elapsed and eta.
std::string format_hms(double seconds);

/// The GPUs' utilisation and memory from the sampler's newest sample, "gpu0 97% 3.2/80.0 GiB" per GPU; "" when the
/// sample has no GPU.
std::string progress_gpu_text(const MonitorSample& s);

/// Whether stdout can show a live display: it is a terminal and $TERM is not "dumb".
bool console_is_live();
/// Columns of the terminal on stdout (TIOCGWINSZ), else $COLUMNS, else 80.
int console_width();

/// The display on the console. While it exists, log lines are printed above the bar and the periodic step lines
/// (step_logger()) go to train.log alone. Redraws are limited by time, not by steps: due() says when one is.
class ProgressDisplay : NonCopyable {
 public:
  ProgressDisplay();
  /// Leaves an unfinished bar (an interrupted or failed run) on the screen as it was last drawn.
  ~ProgressDisplay();

  /// True when the last draw is at least 0.1 s old, so that the caller builds a state at most ten times a second.
  bool due() const;
  /// Redraws the bar in place.
  void show(const ProgressState& s);
  /// Prints the epoch's final line as a permanent line; the next show() starts a new bar below it.
  void finish(const ProgressState& s);

 private:
  std::chrono::steady_clock::time_point m_last_draw{};
};

}  // namespace gt
