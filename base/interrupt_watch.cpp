#include "base/interrupt_watch.hpp"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace stowage {

namespace {

std::atomic<std::uint64_t> interrupts{0};
thread_local int holds = 0;  // InterruptHolds alive on this thread
// The handler ours replaced; written only while ours is not installed.
struct sigaction previous_action {};

void on_interrupt(int signal, siginfo_t* info, void* context) {
  interrupts.fetch_add(1, std::memory_order_relaxed);
  if ((previous_action.sa_flags & SA_SIGINFO) != 0) {
    previous_action.sa_sigaction(signal, info, context);
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signal);
  }
}

bool is_ours(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 && action.sa_sigaction == &on_interrupt;
}

struct Installation {
  std::mutex mutex;
  int watches = 0;
  bool installed = false;
};

Installation& installation() {
  static auto* instance = new Installation();  // never destroyed: watches may outlive statics
  return *instance;
}

void install_locked(Installation& state) {
  struct sigaction current {};
  if (::sigaction(SIGINT, nullptr, &current) != 0 || is_ours(current)) return;
  const bool has_handler = (current.sa_flags & SA_SIGINFO) != 0 ||
                           (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
  if (!has_handler) return;  // the default ends the process; ignored stays ignored
  previous_action = current;
  struct sigaction ours {};
  ours.sa_sigaction = &on_interrupt;
  ours.sa_mask = current.sa_mask;
  const auto flags = static_cast<unsigned>(current.sa_flags) | static_cast<unsigned>(SA_SIGINFO);
  ours.sa_flags = static_cast<int>(flags & ~static_cast<unsigned>(SA_RESETHAND));
  state.installed = ::sigaction(SIGINT, &ours, nullptr) == 0;
}

void uninstall_locked(Installation& state) {
  if (!state.installed) return;
  struct sigaction current {};
  if (::sigaction(SIGINT, nullptr, &current) == 0 && is_ours(current)) {
    ::sigaction(SIGINT, &previous_action, nullptr);
  }
  state.installed = false;
}

}  // namespace

InterruptWatch::InterruptWatch() : seen_(interrupts.load(std::memory_order_relaxed)) {
  Installation& state = installation();
  std::lock_guard lock(state.mutex);
  if (state.watches++ == 0) install_locked(state);
}

InterruptWatch::~InterruptWatch() {
  Installation& state = installation();
  std::lock_guard lock(state.mutex);
  if (--state.watches == 0) uninstall_locked(state);
}

bool InterruptWatch::interrupted() const noexcept {
  return interrupts.load(std::memory_order_relaxed) != seen_;
}

InterruptHold::InterruptHold() noexcept { ++holds; }
InterruptHold::~InterruptHold() { --holds; }
bool InterruptHold::active() noexcept { return holds > 0; }

}  // namespace stowage
