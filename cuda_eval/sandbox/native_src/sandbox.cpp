// See sandbox.h. The child side runs between clone(CLONE_VM|CLONE_VFORK) and execve: it shares our memory, so it
// only makes raw system calls on data prepared before the clone (no malloc, no locks, no glibc set*id wrappers,
// which would try to broadcast to our other threads).
#include "sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace cuda_eval {
namespace {

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void set_cloexec_nonblock(int fd, bool nonblock) {
  int flags = fcntl(fd, F_GETFD);
  fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  if (nonblock) {
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  }
}

void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
}

void close_fd(int& fd) {
  if (fd >= 0) {
    close(fd);
    fd = -1;
  }
}

// What the child reports through the error pipe when a step before execve fails.
struct ChildError {
  int step;  // index into kChildSteps
  int err;   // errno
};
const char* const kChildSteps[] = {"setsid", "dup2", "chdir", "setrlimit", "setgroups", "setresgid", "setresuid",
                                   "prctl", "execve", "unshare(CLONE_NEWNET|CLONE_NEWIPC)", "setpriority",
                                   "joining its cgroup (cgroup.procs)", "oom_score_adj",
                                   "user namespace (setgroups/uid_map/gid_map)", "making / read-only (mount_setattr)",
                                   "bind-mounting its work dir writable", "mounting /proc", "mounting /dev/shm",
                                   "parent exited", "limiting SysV shared memory in its IPC namespace"};
enum ChildStep { kSetsid, kDup2, kChdir, kSetrlimit, kSetgroups, kSetgid, kSetuid, kPrctl, kExecve, kUnshareNet,
                 kSetpriority, kCgroup, kOomScore, kUserMap, kReadOnly, kBindWork, kMountProc, kMountShm,
                 kParentGone, kIpcLimits };

// mount_setattr(2) (Linux 5.12): older headers lack it. The number is the same on every architecture.
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
struct MountAttr {
  unsigned long long attr_set, attr_clr, propagation, userns_fd;
};
constexpr unsigned long long kMountAttrRdonly = 0x1;
constexpr int kAtRecursive = 0x8000;

// Everything the child needs, prepared by the parent.
struct ChildPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  const char* cwd;
  int stdin_fd, stdout_fd, stderr_fd, err_fd;
  struct {
    int resource;
    long long value;
  } limits[9];
  int n_limits;
  long long uid, gid;
  bool die_with_parent;
  pid_t parent_pid;
  int pass_fds[kMaxPassFds];
  int n_pass;
  bool new_netns, new_ipcns;
  int nice;
  int oom_score_adj;
  const char* cgroup_procs;  // "" = none
  bool userns;
  char root_uid_map[64], root_gid_map[64];  // ours -> 0 in the namespace that owns the others
  char uid_map[64], gid_map[64];            // 0 there -> ours again, where the program runs
  const char* writable_dir;
  char shm_options[64];
  char shmmax[32], shmall[32];  // SysV shared memory limits of a new IPC namespace (bytes, pages)
  bool have_shm;
  int parent_pidfd;          // userns (new PID namespace, so getppid() is 0): how the child sees its parent exit
};

// Write a short string to a file (raw system calls: the child may not allocate). 0 on success.
int write_file(const char* path, const char* text) {
  int fd = static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CLOEXEC));
  if (fd < 0) return -1;
  ssize_t n = write(fd, text, strlen(text));
  int saved = errno;
  close(fd);
  errno = saved;
  return n == static_cast<ssize_t>(strlen(text)) ? 0 : -1;
}

[[noreturn]] void child_fail(const ChildPlan* plan, int step) {
  ChildError e{step, errno};
  ssize_t ignored = write(plan->err_fd, &e, sizeof(e));
  (void)ignored;
  _exit(127);
}

int child_main(void* arg) {
  const ChildPlan* plan = static_cast<const ChildPlan*>(arg);
  // First into its cgroup, so that everything it does from here on is accounted and limited there.
  if (plan->cgroup_procs[0] && write_file(plan->cgroup_procs, "0") != 0) child_fail(plan, kCgroup);
  if (plan->userns) {
    // clone() made the namespaces, owned by a user namespace in which we are root (our uid/gid mapped to 0, the
    // one mapping an unprivileged process may write): root there may mount and set the IPC namespace's limits.
    // The program itself runs one user namespace further down (see below), as our own uid, with no capabilities.
    if (write_file("/proc/self/setgroups", "deny") != 0 || write_file("/proc/self/uid_map", plan->root_uid_map) != 0 ||
        write_file("/proc/self/gid_map", plan->root_gid_map) != 0)
      child_fail(plan, kUserMap);
    // No credential change follows in this mode, so the parent-death signal can be set now, while the parent's
    // pidfd is still open (the descriptor sweep below closes it).
    if (plan->die_with_parent) {
      if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) child_fail(plan, kPrctl);
      pollfd p{plan->parent_pidfd, POLLIN, 0};
      if (plan->parent_pidfd >= 0 && poll(&p, 1, 0) > 0) child_fail(plan, kParentGone);
    }
  }
  if (setsid() < 0) child_fail(plan, kSetsid);
  // Move the error pipe and the descriptors to hand over above the range they will occupy (3 .. 3+n_pass), then
  // install the standard streams and the handed-over descriptors (dup2 clears close-on-exec on the copies).
  const int first_free = 3 + plan->n_pass;
  int err_fd = fcntl(plan->err_fd, F_DUPFD_CLOEXEC, first_free);
  if (err_fd < 0) child_fail(plan, kDup2);
  const_cast<ChildPlan*>(plan)->err_fd = err_fd;  // our stack copy (parent is suspended: CLONE_VFORK)
  int moved[kMaxPassFds];
  for (int i = 0; i < plan->n_pass; ++i) {
    moved[i] = fcntl(plan->pass_fds[i], F_DUPFD_CLOEXEC, first_free);
    if (moved[i] < 0) child_fail(plan, kDup2);
  }
  if (dup2(plan->stdin_fd, 0) < 0 || dup2(plan->stdout_fd, 1) < 0 || dup2(plan->stderr_fd, 2) < 0)
    child_fail(plan, kDup2);
  for (int i = 0; i < plan->n_pass; ++i) {
    if (dup2(moved[i], 3 + i) < 0) child_fail(plan, kDup2);
  }
  // Close every other inherited descriptor except the error pipe (which is close-on-exec).
  for (int fd = first_free; fd < err_fd; ++fd) close(fd);
#ifdef SYS_close_range
  if (syscall(SYS_close_range, err_fd + 1, ~0U, 0) != 0)
#endif
  {
    rlimit nofile;
    long max_fd = (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) ? nofile.rlim_cur
                                                                                                : 65536;
    for (long fd = err_fd + 1; fd < max_fd; ++fd) close(fd);
  }
  if (plan->userns) {
    // Our mounts stay ours (no propagation back to the host), then every mount read-only, the work dir bound
    // writable on top of itself (before chdir, so that the cwd is the writable mount), a /proc of this PID
    // namespace (the host's processes vanish from view) and a private /dev/shm.
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) child_fail(plan, kReadOnly);
    MountAttr ro{kMountAttrRdonly, 0, 0, 0};
    if (syscall(SYS_mount_setattr, AT_FDCWD, "/", kAtRecursive, &ro, sizeof(ro)) != 0) child_fail(plan, kReadOnly);
    if (plan->writable_dir[0]) {
      if (mount(plan->writable_dir, plan->writable_dir, nullptr, MS_BIND, nullptr) != 0) child_fail(plan, kBindWork);
      MountAttr rw{0, kMountAttrRdonly, 0, 0};
      if (syscall(SYS_mount_setattr, AT_FDCWD, plan->writable_dir, 0, &rw, sizeof(rw)) != 0)
        child_fail(plan, kBindWork);
    }
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) child_fail(plan, kMountProc);
    if (plan->have_shm &&
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, plan->shm_options) != 0)
      child_fail(plan, kMountShm);
  }
  if (plan->cwd[0] && chdir(plan->cwd) != 0) child_fail(plan, kChdir);
  // No network: a namespace of its own with only a loopback interface, which is down; no SysV IPC objects or POSIX
  // message queues shared with anyone (both die with the last process in them). Before dropping privileges.
  const int unshare_flags = (plan->new_netns ? CLONE_NEWNET : 0) | (plan->new_ipcns ? CLONE_NEWIPC : 0);
  if (!plan->userns && unshare_flags && syscall(SYS_unshare, unshare_flags) != 0) child_fail(plan, kUnshareNet);
  // SysV shared memory is host RAM that no rlimit counts, and in its own namespace the disk-quota watchdog cannot
  // see it: bound it there (these sysctls belong to the IPC namespace).
  if (plan->new_ipcns || plan->userns) {
    if (write_file("/proc/sys/kernel/shmmax", plan->shmmax) != 0 ||
        write_file("/proc/sys/kernel/shmall", plan->shmall) != 0)
      child_fail(plan, kIpcLimits);
  }
  if (plan->userns) {
    // A user namespace of its own under ours, in which it is our uid/gid again: no capability over its mounts,
    // its IPC namespace or anything else set up above (they belong to the namespace where we were root).
    if (syscall(SYS_unshare, CLONE_NEWUSER) != 0 || write_file("/proc/self/setgroups", "deny") != 0 ||
        write_file("/proc/self/uid_map", plan->uid_map) != 0 || write_file("/proc/self/gid_map", plan->gid_map) != 0)
      child_fail(plan, kUserMap);
  }
  // The OOM killer's first pick under host memory pressure, before the trainer (raising it needs no privilege).
  if (plan->oom_score_adj != kKeepOomScore) {
    char value[16];
    int v = plan->oom_score_adj, i = 15;
    bool neg = v < 0;
    unsigned u = static_cast<unsigned>(neg ? -v : v);
    value[i] = '\0';
    do {
      value[--i] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u);
    if (neg) value[--i] = '-';
    if (write_file("/proc/self/oom_score_adj", value + i) != 0) child_fail(plan, kOomScore);
  }
  if (plan->nice > 0 && syscall(SYS_setpriority, PRIO_PROCESS, 0, plan->nice) != 0) child_fail(plan, kSetpriority);
  for (int i = 0; i < plan->n_limits; ++i) {
    rlimit r;
    r.rlim_cur = r.rlim_max = static_cast<rlim_t>(plan->limits[i].value);
    // CPU: SIGXCPU at the soft limit says why the process died; SIGKILL one second later if it ignores it.
    if (plan->limits[i].resource == RLIMIT_CPU) r.rlim_max = r.rlim_cur + 1;
    if (setrlimit(plan->limits[i].resource, &r) != 0) {
      // An unprivileged process cannot raise its hard limit: lower only the soft limit then.
      rlimit cur;
      if (getrlimit(plan->limits[i].resource, &cur) != 0) child_fail(plan, kSetrlimit);
      if (cur.rlim_max != RLIM_INFINITY && r.rlim_cur > cur.rlim_max) r.rlim_cur = cur.rlim_max;
      r.rlim_max = cur.rlim_max;
      if (setrlimit(plan->limits[i].resource, &r) != 0) child_fail(plan, kSetrlimit);
    }
  }
  if (plan->gid >= 0) {
    if (syscall(SYS_setgroups, 0, nullptr) != 0) child_fail(plan, kSetgroups);
    if (syscall(SYS_setresgid, plan->gid, plan->gid, plan->gid) != 0) child_fail(plan, kSetgid);
  }
  if (plan->uid >= 0) {
    if (syscall(SYS_setresuid, plan->uid, plan->uid, plan->uid) != 0) child_fail(plan, kSetuid);
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(plan, kPrctl);
  // After the credential change (which clears it).
  if (plan->die_with_parent && !plan->userns) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) child_fail(plan, kPrctl);
    if (getppid() != plan->parent_pid) _exit(127);
  }
  // Ignored signals survive execve (Python ignores SIGPIPE): give the program default dispositions and mask.
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  execve(plan->path, plan->argv, plan->envp);
  child_fail(plan, kExecve);
}

// PATH lookup in the child's environment, done in the parent so that a missing program is a clear error here.
std::string resolve_program(const std::string& program, const std::vector<std::string>& env) {
  if (program.find('/') != std::string::npos) return program;
  std::string path_var = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& kv : env) {
    if (kv.rfind("PATH=", 0) == 0) path_var = kv.substr(5);
  }
  size_t begin = 0;
  while (begin <= path_var.size()) {
    size_t end = path_var.find(':', begin);
    if (end == std::string::npos) end = path_var.size();
    std::string dir = path_var.substr(begin, end - begin);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  throw std::runtime_error("program not found on the sandbox PATH: " + program);
}

// Runs `fn(arg)` in a vfork-like child with its own small stack and waits for it to exit or exec.
pid_t clone_child(int (*fn)(void*), void* arg, int ns_flags = 0) {
  const size_t stack_size = 256 * 1024;
  void* stack = mmap(nullptr, stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap child stack");
  pid_t pid = clone(fn, static_cast<char*>(stack) + stack_size, CLONE_VM | CLONE_VFORK | SIGCHLD | ns_flags, arg);
  int saved = errno;
  munmap(stack, stack_size);  // CLONE_VFORK: the child has exec'ed or exited by now
  if (pid < 0) throw std::system_error(saved, std::generic_category(), "clone");
  return pid;
}

struct KillUidPlan {
  long long uid;
};

int kill_uid_child(void* arg) {
  const KillUidPlan* plan = static_cast<const KillUidPlan*>(arg);
  if (syscall(SYS_setresgid, 65534, 65534, 65534) != 0) _exit(1);
  if (syscall(SYS_setresuid, plan->uid, plan->uid, plan->uid) != 0) _exit(2);
  // As that uid, -1 reaches exactly the processes of that uid (except this one). The kernel walks the task list
  // under its lock, so a fork loop cannot outrun one sweep.
  kill(-1, SIGKILL);
  _exit(0);
}

void append_capped(std::string& buf, bool& truncated, const char* data, size_t n, long long cap) {
  size_t room = buf.size() < static_cast<size_t>(cap) ? static_cast<size_t>(cap) - buf.size() : 0;
  if (n > room) {
    truncated = true;
    n = room;
  }
  buf.append(data, n);
}

// VmHWM of one process in bytes (0 if unreadable). The child's own rusage maxrss cannot be used: execve records the
// high-water mark of the mm it leaves, and with CLONE_VM that is the *parent's* (a trainer's tens of GB).
long long read_vmhwm(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/status", static_cast<int>(pid));
  FILE* f = fopen(path, "re");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, "VmHWM:", 6) == 0) {
      kb = strtoll(line + 6, nullptr, 10);
      break;
    }
  }
  fclose(f);
  return kb * 1024;
}

}  // namespace

int count_uid_processes(long long uid) {
  DIR* proc = opendir("/proc");
  if (!proc) return -1;
  int count = 0;
  while (dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    char path[300];
    snprintf(path, sizeof(path), "/proc/%s/status", entry->d_name);
    FILE* f = fopen(path, "re");
    if (!f) continue;
    char line[256];
    char state = '?';
    long long real_uid = -1;
    while (fgets(line, sizeof(line), f)) {
      if (strncmp(line, "State:", 6) == 0) {
        const char* p = line + 6;
        while (*p == ' ' || *p == '\t') ++p;
        state = *p;
      } else if (strncmp(line, "Uid:", 4) == 0) {
        real_uid = strtoll(line + 4, nullptr, 10);
        break;
      }
    }
    fclose(f);
    if (real_uid == uid && state != 'Z' && state != 'X') ++count;
  }
  closedir(proc);
  return count;
}

int kill_uid(long long uid) {
  if (uid <= 0 || uid == static_cast<long long>(getuid())) return count_uid_processes(uid);
  if (geteuid() != 0) return count_uid_processes(uid);  // cannot become another uid
  KillUidPlan plan{uid};
  int alive = 0;
  for (int round = 0; round < 20; ++round) {
    pid_t helper = clone_child(kill_uid_child, &plan);
    int status;
    while (waitpid(helper, &status, 0) < 0 && errno == EINTR) {
    }
    alive = count_uid_processes(uid);
    if (alive == 0) return 0;
    usleep(2000 * (round + 1));
  }
  return alive;
}

std::unique_ptr<Child> Child::start(const SpawnOptions& options) {
  if (options.argv.empty()) throw std::invalid_argument("argv must not be empty");
  std::string path = resolve_program(options.argv[0], options.env);

  std::vector<std::string> argv_store(options.argv), env_store(options.env);
  std::vector<char*> argv_ptrs, env_ptrs;
  for (auto& s : argv_store) argv_ptrs.push_back(s.data());
  argv_ptrs.push_back(nullptr);
  for (auto& s : env_store) env_ptrs.push_back(s.data());
  env_ptrs.push_back(nullptr);

  std::unique_ptr<Child> child(new Child());
  child->uid_ = options.uid;
  child->sweep_uid_ = options.sweep_uid;
  child->cap_ = options.output_cap_bytes;

  int in_pipe[2] = {-1, -1}, out_pipe[2], err_pipe[2], exec_pipe[2];
  int devnull = -1;
  make_pipe(out_pipe);
  make_pipe(err_pipe);
  make_pipe(exec_pipe);
  if (options.pipe_stdin) {
    make_pipe(in_pipe);
  } else {
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) throw std::system_error(errno, std::generic_category(), "open /dev/null");
  }

  ChildPlan plan{};
  plan.path = path.c_str();
  plan.argv = argv_ptrs.data();
  plan.envp = env_ptrs.data();
  plan.cwd = options.cwd.c_str();
  plan.stdin_fd = options.pipe_stdin ? in_pipe[0] : devnull;
  plan.stdout_fd = out_pipe[1];
  plan.stderr_fd = err_pipe[1];
  plan.err_fd = exec_pipe[1];
  const Limits& L = options.limits;
  const std::pair<int, long long> wanted[] = {
      {RLIMIT_AS, L.address_space_bytes}, {RLIMIT_DATA, L.data_bytes},     {RLIMIT_CPU, L.cpu_seconds},
      {RLIMIT_NOFILE, L.open_files},      {RLIMIT_FSIZE, L.file_size_bytes}, {RLIMIT_NPROC, L.processes},
      {RLIMIT_STACK, L.stack_bytes},      {RLIMIT_CORE, L.core_bytes},       {RLIMIT_MSGQUEUE, L.msgqueue_bytes}};
  for (const auto& [resource, value] : wanted) {
    if (value >= 0) plan.limits[plan.n_limits++] = {resource, value};
  }
  plan.uid = options.uid;
  plan.gid = options.gid;
  plan.die_with_parent = options.die_with_parent_thread;
  plan.parent_pid = getpid();
  if (options.pass_fds.size() > static_cast<size_t>(kMaxPassFds))
    throw std::invalid_argument("at most " + std::to_string(kMaxPassFds) + " pass_fds");
  for (int fd : options.pass_fds) {
    if (fd < 0 || fcntl(fd, F_GETFD) < 0) throw std::invalid_argument("pass_fds: bad descriptor " + std::to_string(fd));
    plan.pass_fds[plan.n_pass++] = fd;
  }
  plan.new_netns = options.new_netns;
  plan.new_ipcns = options.new_ipcns;
  plan.nice = std::max(0, std::min(19, options.nice));
  plan.oom_score_adj = options.oom_score_adj;
  plan.cgroup_procs = options.cgroup_procs.c_str();
  plan.userns = options.userns;
  plan.writable_dir = options.writable_dir.c_str();
  plan.parent_pidfd = -1;
  const long long shm_bytes = std::max(1LL << 20, options.shm_bytes);
  snprintf(plan.shmmax, sizeof(plan.shmmax), "%lld", shm_bytes);
  snprintf(plan.shmall, sizeof(plan.shmall), "%lld", shm_bytes / sysconf(_SC_PAGESIZE));
  int ns_flags = 0;
  if (options.userns) {
    if (options.uid >= 0 || options.gid >= 0) throw std::invalid_argument("userns runs as our own uid: no uid/gid");
    snprintf(plan.root_uid_map, sizeof(plan.root_uid_map), "0 %u 1", geteuid());
    snprintf(plan.root_gid_map, sizeof(plan.root_gid_map), "0 %u 1", getegid());
    snprintf(plan.uid_map, sizeof(plan.uid_map), "%u 0 1", geteuid());
    snprintf(plan.gid_map, sizeof(plan.gid_map), "%u 0 1", getegid());
    snprintf(plan.shm_options, sizeof(plan.shm_options), "size=%lld,mode=1777", shm_bytes);
    struct stat st;
    plan.have_shm = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode);
    ns_flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC;
#ifdef SYS_pidfd_open
    if (options.die_with_parent_thread) plan.parent_pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
#endif
  }

  child->start_time_ = now_s();
  if (options.lifetime_s >= 0) child->lifetime_deadline_ = child->start_time_ + options.lifetime_s;
  pid_t pid;
  try {
    pid = clone_child(child_main, &plan, ns_flags);
  } catch (...) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_pipe[0],
                   exec_pipe[1], devnull, plan.parent_pidfd})
      if (fd >= 0) close(fd);
    throw;
  }
  if (plan.parent_pidfd >= 0) close(plan.parent_pidfd);
  child->pid_ = pid;
  // Parent: drop the child's ends, then learn whether execve succeeded (EOF) or what failed.
  for (int fd : {in_pipe[0], out_pipe[1], err_pipe[1], exec_pipe[1], devnull})
    if (fd >= 0) close(fd);
  ChildError failure{};
  ssize_t got;
  while ((got = read(exec_pipe[0], &failure, sizeof(failure))) < 0 && errno == EINTR) {
  }
  close(exec_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(failure))) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(out_pipe[0]);
    close(err_pipe[0]);
    if (in_pipe[1] >= 0) close(in_pipe[1]);
    child->pid_ = -1;
    std::string msg = std::string("sandboxed child failed at ") + kChildSteps[failure.step] + " for '" + path +
                      "'" + (options.uid >= 0 ? " as uid " + std::to_string(options.uid) : std::string()) +
                      ": " + strerror(failure.err);
    throw std::runtime_error(msg);
  }
  child->stdout_fd_ = out_pipe[0];
  child->stderr_fd_ = err_pipe[0];
  child->stdin_fd_ = in_pipe[1];
  set_cloexec_nonblock(child->stdout_fd_, true);
  set_cloexec_nonblock(child->stderr_fd_, true);
  if (child->stdin_fd_ >= 0) set_cloexec_nonblock(child->stdin_fd_, true);
#ifdef SYS_pidfd_open
  child->pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#endif
  child->monitor_thread_ = std::thread(&Child::monitor, child.get());
  return child;
}

void Child::kill_everything() {
  // Once reaped, the pid (and the group id) may belong to someone else, and the uid may have been leased to another
  // sandbox: never signal either again (the sweep at reap time already ran).
  if (reaped_.load()) return;
  if (pid_ > 0) ::kill(-pid_, SIGKILL);
  if (sweep_uid_ && uid_ > 0 && uid_ != static_cast<long long>(getuid())) kill_uid(uid_);
}

void Child::monitor() {
  std::string out, err;
  bool out_trunc = false, err_trunc = false;
  bool exited = false;
  int status = 0;
  rusage usage{};
  double end_time = 0;
  long long peak_rss = 0;
  double last_sample = 0;
  char buf[65536];

  auto drain = [&](int& fd, std::string& dst, bool& trunc) {
    while (fd >= 0) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) {
        append_capped(dst, trunc, buf, static_cast<size_t>(n), cap_);
      } else if (n == 0) {
        close_fd(fd);
      } else if (errno == EINTR) {
        continue;
      } else {
        if (errno != EAGAIN && errno != EWOULDBLOCK) close_fd(fd);
        return;
      }
    }
  };
  auto reap = [&]() {
    // The child is a zombie (or about to be): kill what it left behind while its pid still pins the group id.
    kill_everything();
    while (wait4(pid_, &status, 0, &usage) < 0 && errno == EINTR) {
    }
    reaped_.store(true);
    end_time = now_s();
    exited = true;
  };

  double drain_deadline = 0;
  while (true) {
    if (exited && stdout_fd_ < 0 && stderr_fd_ < 0) break;
    if (exited && now_s() > drain_deadline) break;  // an escaped process still holds the pipes: stop reading
    pollfd fds[3];
    int n = 0;
    int idx_out = -1, idx_err = -1, idx_pid = -1;
    if (stdout_fd_ >= 0) {
      idx_out = n;
      fds[n++] = {stdout_fd_, POLLIN, 0};
    }
    if (stderr_fd_ >= 0) {
      idx_err = n;
      fds[n++] = {stderr_fd_, POLLIN, 0};
    }
    if (!exited && pidfd_ >= 0) {
      idx_pid = n;
      fds[n++] = {pidfd_, POLLIN, 0};
    }
    // Wake at least every 50 ms while the child runs, to sample its memory high-water mark.
    int timeout_ms = exited ? 50 : (pidfd_ >= 0 ? 50 : 10);
    if (!exited && lifetime_deadline_ >= 0) {
      double left = lifetime_deadline_ - now_s();
      if (left <= 0) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          timed_out_ = true;
        }
        kill_everything();
        lifetime_deadline_ = -1;
        left = 0.05;
      }
      int left_ms = static_cast<int>(left * 1000) + 1;
      if (timeout_ms < 0 || left_ms < timeout_ms) timeout_ms = left_ms;
    }
    int rc = poll(fds, n, timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    if (idx_out >= 0 && fds[idx_out].revents) drain(stdout_fd_, out, out_trunc);
    if (idx_err >= 0 && fds[idx_err].revents) drain(stderr_fd_, err, err_trunc);
    if (!exited && now_s() - last_sample >= 0.01) {
      peak_rss = std::max(peak_rss, read_vmhwm(pid_));
      last_sample = now_s();
    }
    if (!exited) {
      bool gone = false;
      if (idx_pid >= 0) {
        gone = fds[idx_pid].revents != 0;
      } else {
        siginfo_t info{};
        gone = waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
      }
      if (gone) {
        reap();
        drain_deadline = now_s() + 2.0;
      }
    }
  }
  close_fd(stdout_fd_);
  close_fd(stderr_fd_);
  close_fd(pidfd_);

  std::lock_guard<std::mutex> lk(mu_);
  result_.wall_s = end_time - start_time_;
  result_.cpu_s = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec +
                  usage.ru_stime.tv_usec * 1e-6;
  result_.peak_rss_bytes = peak_rss;
  if (WIFEXITED(status)) {
    result_.exit_code = WEXITSTATUS(status);
    result_.signal = 0;
  } else if (WIFSIGNALED(status)) {
    result_.exit_code = -1;
    result_.signal = WTERMSIG(status);
  }
  result_.stdout_data = std::move(out);
  result_.stderr_data = std::move(err);
  result_.stdout_truncated = out_trunc;
  result_.stderr_truncated = err_trunc;
  done_ = true;
  cv_.notify_all();
}

void Child::write_stdin(const std::string& data, double timeout_s) {
  if (stdin_fd_ < 0) throw std::runtime_error("stdin is not a pipe (spawned without stdin) or already closed");
  double deadline = now_s() + timeout_s;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(stdin_fd_, data.data() + off, data.size() - off);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) throw std::runtime_error("the child closed its stdin (exited?)");
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      throw std::system_error(errno, std::generic_category(), "write to child stdin");
    double left = deadline - now_s();
    if (left <= 0) throw std::runtime_error("timed out writing to the child's stdin (it is not reading)");
    pollfd p{stdin_fd_, POLLOUT, 0};
    poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (p.revents & (POLLERR | POLLHUP)) throw std::runtime_error("the child closed its stdin (exited?)");
  }
}

void Child::close_stdin() { close_fd(stdin_fd_); }

bool Child::done() {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

void Child::kill() { kill_everything(); }

RunResult Child::wait(double timeout_s) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    bool finished;
    if (timeout_s < 0) {
      cv_.wait(lk, [&] { return done_; });
      finished = true;
    } else {
      finished = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return done_; });
    }
    if (!finished) {
      timed_out_ = true;
      lk.unlock();
      kill_everything();
      lk.lock();
      cv_.wait(lk, [&] { return done_; });
    }
  }
  if (monitor_thread_.joinable()) monitor_thread_.join();
  close_stdin();
  RunResult r = result_;
  r.timed_out = timed_out_;
  return r;
}

Child::~Child() {
  if (monitor_thread_.joinable()) {
    kill_everything();
    monitor_thread_.join();
  }
  close_fd(stdin_fd_);
  close_fd(stdout_fd_);
  close_fd(stderr_fd_);
  close_fd(pidfd_);
}

RunResult run(const SpawnOptions& options, const std::string* stdin_data, double timeout_s) {
  SpawnOptions opts = options;
  opts.pipe_stdin = stdin_data != nullptr;
  double t0 = now_s();
  std::unique_ptr<Child> child = Child::start(opts);
  if (stdin_data) {
    try {
      child->write_stdin(*stdin_data, timeout_s < 0 ? 1e9 : timeout_s);
    } catch (const std::runtime_error&) {
      // The child stopped reading or exited: its result says why; a hung writer is covered by the timeout below.
    }
    child->close_stdin();
  }
  double left = timeout_s < 0 ? -1 : std::max(0.0, timeout_s - (now_s() - t0));
  return child->wait(left);
}

}  // namespace cuda_eval
