// Signal handlers that only set a flag (and, for a second SIGINT, leave at once): everything else happens in the
// training loop between steps, where a checkpoint can be written consistently.
#include "train/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace gt {
namespace {

std::atomic<int> g_stop{0};
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1};
int g_installed = 0;  ///< nesting depth of install_stop_handlers (called from the main thread only)

void write_stderr(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (g_stop.compare_exchange_strong(expected, sig)) {
    write_stderr(
        "\ngputrain: stop requested: finishing the step and writing a checkpoint (Ctrl-C again exits at "
        "once)\n");
    return;
  }
  if (sig == SIGINT) {
    write_stderr("\ngputrain: second interrupt: exiting now; the last complete checkpoint is kept\n");
    ::_exit(130);
  }
}

}  // namespace

void install_stop_handlers() {
  if (g_installed++ > 0) return;
  g_stop = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : kSignals) sigaction(s, &sa, nullptr);
}

void remove_stop_handlers() {
  if (g_installed == 0 || --g_installed > 0) return;
  for (int s : kSignals) std::signal(s, SIG_DFL);
}

int stop_requested() { return g_stop.load(std::memory_order_relaxed); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace gt
