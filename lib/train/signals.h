// Graceful stops: SIGINT, SIGTERM and SIGUSR1 (what schedulers send before preemption) ask the training loop to
// finish its step, write a checkpoint and exit 75; a second SIGINT exits at once with 130.
#pragma once

namespace gt {

/// Installs the handlers (idempotent). Until then the signals keep their default actions.
void install_stop_handlers();
/// Restores the default actions (the training loop is over).
void remove_stop_handlers();
/// The signal that asked to stop, or 0.
int stop_requested();
/// "SIGTERM" etc.
const char* signal_name(int sig);

}  // namespace gt
