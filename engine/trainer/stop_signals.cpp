#include "trainer/stop_signals.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <ctime>
#include <memory>
#include <mutex>
#include <vector>

#include "trainer/train.h"

namespace engine {

namespace {

// Preemption: the first SIGTERM, SIGINT or SIGUSR1 asks for a checkpoint and a stop after the
// step; a second one ends the process at once (only committed checkpoints remain, all intact).
std::atomic<int> g_stop_signals{0};
std::atomic<int64_t> g_first_signal_ns{0};
constexpr int kStopSignals[StopSignals::kSignals] = {SIGTERM, SIGINT, SIGUSR1};

int64_t monotonic_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

std::atomic<bool> g_launched_rank{false};

extern "C" void on_stop_signal(int) {
  // A second signal ends the process at once, as _exit() would. exit_group goes through syscall(),
  // which is not declared noreturn: the sanitizer build precedes calls to noreturn functions with a
  // stack cleanup that is not safe in a handler running on another thread's stack.
  if (g_stop_signals.fetch_add(1) > 0) syscall(SYS_exit_group, kExitRequeue);
  g_first_signal_ns = monotonic_ns();
  // A launcher being stopped (mpirun on SIGTERM) stops reading the ranks' output at once: a rank
  // whose next progress line fills the pipe would block in write() and never reach its checkpoint.
  // From here on, output that cannot be written at once is dropped. (Not for a process on the
  // user's own terminal, whose file flags the shell shares.)
  if (g_launched_rank)
    for (int fd : {STDOUT_FILENO, STDERR_FILENO})
      if (const int flags = fcntl(fd, F_GETFL); flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Once per thread. The stacks are never freed (a signal may still arrive while the process exits)
// but stay reachable, from a list that is itself never destroyed.
void use_alternate_signal_stack() {
  static thread_local bool installed = false;
  if (installed) return;
  stack_t current{};
  if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) {
    installed = true;  // the thread has one already (the sanitizers install theirs): any will do
    return;
  }
  static std::mutex mutex;
  static auto* stacks = new std::vector<std::unique_ptr<char[]>>();
  constexpr size_t kBytes = size_t(1) << 16;
  stack_t alternate{};
  {
    std::lock_guard lock(mutex);
    stacks->push_back(std::make_unique<char[]>(kBytes));
    alternate.ss_sp = stacks->back().get();
  }
  alternate.ss_size = kBytes;
  installed = sigaltstack(&alternate, nullptr) == 0;
}

}  // namespace

StopSignals::StopSignals(bool launched_rank) {
  g_stop_signals = 0;
  g_launched_rank = launched_rank;
  // The handler runs on a stack of its own on the threads that run kernels: the kernel then never
  // writes a signal frame below the stack pointer of the code it interrupts. oneDNN's JIT-compiled
  // GEMM keeps data there, and a frame written over it corrupted the heap (seen with one thread).
  use_alternate_signal_stack();
#pragma omp parallel
  use_alternate_signal_stack();
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART | SA_ONSTACK;  // file writes and MPI's polling carry on
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < kSignals; ++i) sigaction(kStopSignals[i], &action, &previous_[i]);
}

StopSignals::~StopSignals() {
  // Once a stop was asked for, the process is on its way to exit 75: a signal arriving while it
  // tears down must end it with 75 too (the handler's second-signal path), not with 128 + signal.
  if (received()) return;
  for (size_t i = 0; i < kSignals; ++i) sigaction(kStopSignals[i], &previous_[i], nullptr);
}

bool StopSignals::received() { return g_stop_signals.load() > 0; }

double StopSignals::seconds_since() {
  return received() ? double(monotonic_ns() - g_first_signal_ns.load()) * 1e-9 : 0;
}

}  // namespace engine
