// Sandboxed process runner: clone/exec into a new session with rlimits, an optional unprivileged uid/gid,
// captured (capped) stdout/stderr, a wall-clock timeout that kills the whole process group (and, with a dedicated
// uid, every process of that uid), and resource accounting. No Python here; module.cpp binds it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cuda_eval {

// -1 = leave the inherited limit unchanged. Values are applied as both soft and hard limits.
struct Limits {
  long long address_space_bytes = -1;  // RLIMIT_AS
  long long data_bytes = -1;           // RLIMIT_DATA (CUDA tolerates this better than RLIMIT_AS)
  long long cpu_seconds = -1;          // RLIMIT_CPU
  long long open_files = -1;           // RLIMIT_NOFILE
  long long file_size_bytes = -1;      // RLIMIT_FSIZE
  long long processes = -1;            // RLIMIT_NPROC (counts threads of the real uid; not enforced for root)
  long long stack_bytes = -1;          // RLIMIT_STACK
  long long core_bytes = 0;            // RLIMIT_CORE: no core dumps by default
  long long msgqueue_bytes = -1;       // RLIMIT_MSGQUEUE: 0 = no POSIX message queue can be created
};

constexpr int kKeepOomScore = -1001;   // SpawnOptions.oom_score_adj: leave the inherited value

struct SpawnOptions {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "KEY=VALUE" entries: the child's whole environment
  std::string cwd;
  Limits limits;
  long long output_cap_bytes = 1 << 20;  // per stream; the rest is read and discarded
  bool pipe_stdin = false;               // false: stdin is /dev/null
  long long uid = -1;                    // -1: keep ours
  long long gid = -1;
  bool die_with_parent_thread = false;   // PR_SET_PDEATHSIG: only safe when the spawning thread outlives the child
  double lifetime_s = -1;                // > 0: the monitor kills the child this long after start (timed_out)
  bool sweep_uid = true;                 // kill every process of `uid` when the child ends (false: only its group;
                                         // for several concurrent children sharing one uid, swept by the caller)
  std::vector<int> pass_fds;             // our descriptors to hand over, as the child's fds 3, 4, ... (in order)
  bool new_netns = false;                // a new, empty network namespace (loopback down): needs CAP_SYS_ADMIN
  bool new_ipcns = false;                // a new IPC namespace (SysV IPC, POSIX message queues): CAP_SYS_ADMIN
  int nice = 0;                          // > 0: lower CPU priority (compiles yield to the GPU job's host threads)
  int oom_score_adj = kKeepOomScore;     // the child's /proc/self/oom_score_adj (1000: the OOM killer's first pick)
  std::string cgroup_procs;              // a cgroup's cgroup.procs file: the child moves itself there first
  // Unprivileged isolation (no root needed): new user, mount, PID, network and IPC namespaces; our uid/gid mapped
  // to themselves; every mount read-only except `writable_dir`; a fresh /proc (this PID namespace's processes only)
  // and a private tmpfs on /dev/shm of `shm_bytes`. The child is PID 1 of its namespace: when it ends, every
  // process it left behind is killed by the kernel.
  bool userns = false;
  std::string writable_dir;
  long long shm_bytes = 1LL << 30;       // the private /dev/shm (userns), and SysV shared memory in a new IPC ns
};
constexpr int kMaxPassFds = 8;

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // terminating signal, 0 if it exited
  bool timed_out = false;
  double wall_s = 0;
  double cpu_s = 0;                // user + system of the child and its waited-for descendants
  long long peak_rss_bytes = 0;    // sampled VmHWM of the direct child (0 if it ended before the first sample)
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
};

// One running child. A monitor thread drains its output, notices its exit, reaps it and cleans up its group.
class Child {
 public:
  static std::unique_ptr<Child> start(const SpawnOptions& options);  // throws std::runtime_error / std::system_error
  ~Child();  // kills and reaps a child that is still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Blocking write of all of `data` to the child's stdin (needs pipe_stdin); gives up after timeout_s.
  // Throws std::runtime_error if the child closed its stdin / exited, or on timeout.
  void write_stdin(const std::string& data, double timeout_s);
  void close_stdin();
  // Waits for the child to exit; at the timeout (< 0: none) kills the whole group and reports timed_out.
  // Idempotent: later calls return the same result.
  RunResult wait(double timeout_s);
  // True once the child has exited and its output is drained.
  bool done();
  // Kills the whole group (and the uid's processes); wait() then reports the signal (timed_out stays false).
  void kill();

 private:
  Child() = default;
  void monitor();
  void kill_everything();

  pid_t pid_ = -1;
  int pidfd_ = -1;
  int stdin_fd_ = -1, stdout_fd_ = -1, stderr_fd_ = -1;
  long long uid_ = -1;
  bool sweep_uid_ = true;
  std::atomic<bool> reaped_{false};
  long long cap_ = 0;
  double start_time_ = 0;
  double lifetime_deadline_ = -1;

  std::thread monitor_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool timed_out_ = false;
  RunResult result_;
};

// Start, feed stdin (if given), wait. The convenience used by cuda_eval.sandbox.run_sandboxed.
RunResult run(const SpawnOptions& options, const std::string* stdin_data, double timeout_s);

// Kill every process whose real uid is `uid` (not ourselves; refuses uid 0 and our own uid). Returns how many
// processes were still alive after the last round (0 on success).
int kill_uid(long long uid);

// Number of live (non-zombie) processes whose real uid is `uid` (reads /proc).
int count_uid_processes(long long uid);

}  // namespace cuda_eval
