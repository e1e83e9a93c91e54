// Graceful stops: SIGINT, SIGTERM and SIGUSR1 (what schedulers send before preemption) ask the training loop to
// finish its step, write a checkpoint and exit 75; a second SIGINT exits at once with 130.
#pragma once

#include "core/noncopyable.h"

namespace gt {

/// Installs the handlers. Calls nest: the first clears the stop flag, the others leave it (a signal that came
/// while the run was being set up still stops it). Until then the signals keep their default actions.
void install_stop_handlers();
/// Ends one install_stop_handlers; the last restores the default actions.
void remove_stop_handlers();

/// The stop handlers for as long as this exists (`gputrain train` holds them from before any work to its exit).
class StopHandlers : NonCopyable {
 public:
  StopHandlers() { install_stop_handlers(); }
  ~StopHandlers() { remove_stop_handlers(); }
};
/// The signal that asked to stop, or 0.
int stop_requested();
/// "SIGTERM" etc.
const char* signal_name(int sig);

}  // namespace gt
