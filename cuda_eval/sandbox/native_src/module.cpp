// cuda_eval._native: pybind11 bindings of the sandboxed process runner and the CUDA event timer.
// Python-facing contract: docs/ARCHITECTURE.md, "cuda_eval internals".
#include <dirent.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>
#include <optional>

#include "cuda_timer.h"
#include "sandbox.h"

namespace py = pybind11;
using namespace cuda_eval;

namespace {

long long limit_value(const py::handle& value, const std::string& key) {
  if (value.is_none()) return -1;
  long long v = value.cast<long long>();
  if (v < 0) throw py::value_error("limit '" + key + "' must be >= 0 or None, got " + std::to_string(v));
  return v;
}

Limits parse_limits(const py::dict& limits) {
  Limits L;
  for (auto item : limits) {
    std::string key = py::str(item.first);
    long long v = limit_value(item.second, key);
    if (key == "address_space_bytes") L.address_space_bytes = v;
    else if (key == "data_bytes") L.data_bytes = v;
    else if (key == "cpu_seconds") L.cpu_seconds = v;
    else if (key == "open_files") L.open_files = v;
    else if (key == "file_size_bytes") L.file_size_bytes = v;
    else if (key == "processes") L.processes = v;
    else if (key == "stack_bytes") L.stack_bytes = v;
    else if (key == "core_bytes") L.core_bytes = v;
    else if (key == "msgqueue_bytes") L.msgqueue_bytes = v;
    else
      throw py::value_error("unknown limit '" + key +
                            "' (known: address_space_bytes, data_bytes, cpu_seconds, open_files, file_size_bytes, "
                            "processes, stack_bytes, core_bytes, msgqueue_bytes)");
  }
  return L;
}

SpawnOptions make_options(const std::vector<std::string>& argv, const py::dict& env, const std::string& cwd,
                          const py::dict& limits, long long output_cap_bytes, std::optional<long long> uid,
                          std::optional<long long> gid, bool sweep_uid) {
  SpawnOptions o;
  o.argv = argv;
  for (auto item : env) {
    std::string k = py::str(item.first), v = py::str(item.second);
    if (k.empty() || k.find('=') != std::string::npos) throw py::value_error("bad environment variable name: " + k);
    o.env.push_back(k + "=" + v);
  }
  o.cwd = cwd;
  o.limits = parse_limits(limits);
  if (output_cap_bytes < 0) throw py::value_error("output_cap_bytes must be >= 0");
  o.output_cap_bytes = output_cap_bytes;
  if (uid && *uid < 0) throw py::value_error("uid must be >= 0");
  if (gid && *gid < 0) throw py::value_error("gid must be >= 0");
  o.uid = uid.value_or(-1);
  o.gid = gid.value_or(-1);
  o.sweep_uid = sweep_uid;
  return o;
}

// The isolation options shared by run() and spawn().
void set_isolation(SpawnOptions& o, bool new_netns, bool new_ipcns, int nice, std::optional<int> oom_score_adj,
                   const std::string& cgroup_procs, bool userns, const std::string& writable_dir,
                   long long shm_bytes) {
  o.new_netns = new_netns;
  o.new_ipcns = new_ipcns;
  o.nice = nice;
  if (oom_score_adj && (*oom_score_adj < -1000 || *oom_score_adj > 1000))
    throw py::value_error("oom_score_adj must be in -1000..1000 or None");
  o.oom_score_adj = oom_score_adj.value_or(kKeepOomScore);
  o.cgroup_procs = cgroup_procs;
  o.userns = userns;
  if (userns && (writable_dir.empty() || writable_dir[0] != '/'))
    throw py::value_error("userns needs writable_dir, an absolute path");
  o.writable_dir = writable_dir;
  if (shm_bytes < 0) throw py::value_error("shm_bytes must be >= 0");
  o.shm_bytes = shm_bytes;
}

py::dict to_dict(const RunResult& r) {
  py::dict d;
  d["exit_code"] = r.exit_code;
  d["signal"] = r.signal;
  d["timed_out"] = r.timed_out;
  d["wall_s"] = r.wall_s;
  d["cpu_s"] = r.cpu_s;
  d["peak_rss_bytes"] = r.peak_rss_bytes;
  d["stdout"] = py::bytes(r.stdout_data);
  d["stderr"] = py::bytes(r.stderr_data);
  d["stdout_truncated"] = r.stdout_truncated;
  d["stderr_truncated"] = r.stderr_truncated;
  return d;
}

double timeout_value(std::optional<double> timeout_s) {
  if (!timeout_s) return -1;
  if (*timeout_s < 0) throw py::value_error("timeout_s must be >= 0 or None");
  return *timeout_s;
}

// <sys.path entry>/nvidia/<package>/lib: where the CUDA pip wheels put libcudart.
std::vector<std::string> wheel_lib_dirs() {
  std::vector<std::string> dirs;
  py::list path = py::module_::import("sys").attr("path");
  for (auto entry : path) {
    std::string base = py::str(entry);
    if (base.empty()) continue;
    std::string nvidia = base + "/nvidia";
    DIR* d = opendir(nvidia.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') dirs.push_back(nvidia + "/" + e->d_name + "/lib");
    }
    closedir(d);
  }
  return dirs;
}

// A spawned child, as Python sees it.
class Process {
 public:
  explicit Process(std::unique_ptr<Child> child) : child_(std::move(child)) {}
  int pid() const { return child_->pid(); }
  void write_stdin(const py::bytes& data, double timeout_s) {
    std::string s = data;
    py::gil_scoped_release release;
    child_->write_stdin(s, timeout_s);
  }
  void close_stdin() { child_->close_stdin(); }
  py::dict wait(std::optional<double> timeout_s) {
    double t = timeout_value(timeout_s);
    RunResult r;
    {
      py::gil_scoped_release release;
      r = child_->wait(t);
    }
    return to_dict(r);
  }
  py::object poll() {
    if (!child_->done()) return py::none();
    return wait(0.0);
  }
  bool alive() { return !child_->done(); }
  void kill() {
    py::gil_scoped_release release;
    child_->kill();
  }

 private:
  std::unique_ptr<Child> child_;
};

// The output digest's lanes and tree (cuda_eval/protocol/device_kernels.py states the spec; its CUDA kernels and
// torch ops compute the same values) over a host tensor's raw memory: our own code, not ATen ops a candidate's
// extension could register kernels for.
inline uint64_t digest_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
inline uint64_t digest_fold(uint64_t a, uint64_t b) { return digest_mix(a ^ digest_mix(b)) + b; }

std::vector<uint64_t> digest_fold_blocks(const std::vector<uint64_t>& in) {
  std::vector<uint64_t> out((in.size() + 255) / 256);
  uint64_t v[256];
  for (size_t b = 0; b < out.size(); ++b) {
    for (size_t t = 0; t < 256; ++t) v[t] = b * 256 + t < in.size() ? in[b * 256 + t] : 0;
    for (size_t half = 128; half > 0; half >>= 1)
      for (size_t t = 0; t < half; ++t) v[t] = digest_fold(v[t], v[t + half]);
    out[b] = v[0];
  }
  return out;
}

// (the values the host step hashes, as little-endian uint64 bytes; n words) of the elements at `ptr` laid out by
// `sizes` and `strides` (in elements of `itemsize` bytes), read in row-major order.
py::tuple digest_values(uintptr_t ptr, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                        int64_t itemsize, uint64_t key) {
  if (sizes.size() != strides.size() || itemsize <= 0) throw std::invalid_argument("bad tensor layout");
  std::vector<uint64_t> values;
  uint64_t n = 0;
  {
    py::gil_scoped_release release;
    uint64_t numel = 1;
    bool contiguous = true;
    int64_t expected = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      if (sizes[d] < 0 || strides[d] < 0) throw std::invalid_argument("bad tensor layout");
      numel *= static_cast<uint64_t>(sizes[d]);
      if (sizes[d] != 1 && strides[d] != expected) contiguous = false;
      expected *= sizes[d];
    }
    const uint64_t n_bytes = numel * static_cast<uint64_t>(itemsize);
    const unsigned char* base = reinterpret_cast<const unsigned char*>(ptr);
    std::vector<unsigned char> gathered;
    if (!contiguous && numel) {  // the elements in row-major order
      gathered.resize(n_bytes);
      std::vector<int64_t> index(sizes.size(), 0);
      for (uint64_t e = 0; e < numel; ++e) {
        int64_t offset = 0;
        for (size_t d = 0; d < sizes.size(); ++d) offset += index[d] * strides[d];
        std::memcpy(gathered.data() + e * itemsize, base + offset * itemsize, itemsize);
        for (size_t d = sizes.size(); d-- > 0;) {
          if (++index[d] < sizes[d]) break;
          index[d] = 0;
        }
      }
      base = gathered.data();
    }
    n = (n_bytes + 3) / 4;
    const uint64_t lanes = n ? (n + 15) / 16 : 1;
    auto word = [&](uint64_t i) -> uint64_t {
      if (i >= n) return 0;
      uint32_t w = 0;
      const uint64_t at = 4 * i, take = n_bytes - at < 4 ? n_bytes - at : 4;
      std::memcpy(&w, base + at, take);  // little-endian hosts (x86-64, aarch64): the spec's word order
      return w;
    };
    std::vector<uint64_t> h(lanes);
    for (uint64_t j = 0; j < lanes; ++j) {
      uint64_t x = digest_mix(key ^ ((j + 1) * 0x9E3779B97F4A7C15ULL));
      for (uint64_t r = 0; r < 16; ++r) x = digest_mix(x ^ word(r * lanes + j) ^ (r << 40)) + x;
      h[j] = x;
    }
    values = digest_fold_blocks(h);
    while (values.size() > 1024) values = digest_fold_blocks(values);
  }
  std::string bytes(values.size() * 8, '\0');
  for (size_t i = 0; i < values.size(); ++i)
    for (int b = 0; b < 8; ++b) bytes[8 * i + b] = static_cast<char>((values[i] >> (8 * b)) & 0xFF);
  return py::make_tuple(py::bytes(bytes), n);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "cuda_eval native core: sandboxed process runner and CUDA event timer (libcudart loaded at run time).";

  m.def(
      "run",
      [](const std::vector<std::string>& argv, const py::dict& env, const std::string& cwd,
         std::optional<double> timeout_s, const py::dict& limits, long long output_cap_bytes,
         std::optional<py::bytes> stdin_data, std::optional<long long> uid, std::optional<long long> gid,
         bool sweep_uid, bool new_netns, int nice, bool new_ipcns, std::optional<int> oom_score_adj,
         const std::string& cgroup_procs, bool userns, const std::string& writable_dir, long long shm_bytes) {
        SpawnOptions o = make_options(argv, env, cwd, limits, output_cap_bytes, uid, gid, sweep_uid);
        o.die_with_parent_thread = true;  // this thread waits for the child, so it outlives it
        set_isolation(o, new_netns, new_ipcns, nice, oom_score_adj, cgroup_procs, userns, writable_dir, shm_bytes);
        double t = timeout_value(timeout_s);
        std::optional<std::string> input;
        if (stdin_data) input = std::string(*stdin_data);
        RunResult r;
        {
          py::gil_scoped_release release;
          r = cuda_eval::run(o, input ? &*input : nullptr, t);
        }
        return to_dict(r);
      },
      py::arg("argv"), py::kw_only(), py::arg("env"), py::arg("cwd"), py::arg("timeout_s"), py::arg("limits"),
      py::arg("output_cap_bytes"), py::arg("stdin") = py::none(), py::arg("uid") = py::none(),
      py::arg("gid") = py::none(), py::arg("sweep_uid") = true, py::arg("new_netns") = false, py::arg("nice") = 0,
      py::arg("new_ipcns") = false, py::arg("oom_score_adj") = py::none(), py::arg("cgroup_procs") = "",
      py::arg("userns") = false, py::arg("writable_dir") = "", py::arg("shm_bytes") = 1LL << 30,
      "Run argv in a new session with rlimits (dict of Limits fields; None = inherit), env (the whole environment), "
      "cwd, an optional uid/gid. Kills the whole group (and the uid's processes) at timeout_s. Releases the GIL. "
      "Isolation: new_netns / new_ipcns (root), oom_score_adj, cgroup_procs (the child joins that cgroup first), "
      "userns (no root needed: user, mount, PID, network, IPC namespaces; everything read-only but writable_dir; "
      "a fresh /proc and a private /dev/shm of shm_bytes). "
      "Returns dict(exit_code, signal, timed_out, wall_s, cpu_s, peak_rss_bytes, stdout, stderr, stdout_truncated, "
      "stderr_truncated). sweep_uid=False: at the end kill only the child's group, not every process of uid "
      "(for concurrent children sharing one uid; the caller sweeps).");

  py::class_<Process>(m, "Process")
      .def_property_readonly("pid", &Process::pid)
      .def_property_readonly("alive", &Process::alive)
      .def("write_stdin", &Process::write_stdin, py::arg("data"), py::arg("timeout_s") = 30.0,
           "Write all bytes to the child's stdin (raises RuntimeError if it exited or stops reading).")
      .def("close_stdin", &Process::close_stdin)
      .def("wait", &Process::wait, py::arg("timeout_s") = py::none(),
           "Wait for exit; at timeout_s (None: no limit) kill the whole group and report timed_out=True. "
           "Returns the same dict as run(); idempotent.")
      .def("poll", &Process::poll, "The result dict if the child has exited, else None.")
      .def("kill", &Process::kill, "Kill the whole process group (and the uid's processes).");

  m.def(
      "spawn",
      [](const std::vector<std::string>& argv, const py::dict& env, const std::string& cwd,
         std::optional<double> timeout_s, const py::dict& limits, long long output_cap_bytes,
         std::optional<py::bytes> stdin_data, std::optional<long long> uid, std::optional<long long> gid,
         bool sweep_uid, bool die_with_parent_thread, const std::vector<int>& pass_fds, bool new_netns, int nice,
         bool new_ipcns, std::optional<int> oom_score_adj, const std::string& cgroup_procs, bool userns,
         const std::string& writable_dir, long long shm_bytes) {
        SpawnOptions o = make_options(argv, env, cwd, limits, output_cap_bytes, uid, gid, sweep_uid);
        o.pipe_stdin = true;
        o.pass_fds = pass_fds;
        set_isolation(o, new_netns, new_ipcns, nice, oom_score_adj, cgroup_procs, userns, writable_dir, shm_bytes);
        o.die_with_parent_thread = die_with_parent_thread;
        o.lifetime_s = timeout_value(timeout_s);
        std::unique_ptr<Child> child;
        {
          py::gil_scoped_release release;
          child = Child::start(o);
        }
        auto p = std::make_unique<Process>(std::move(child));
        if (stdin_data) p->write_stdin(*stdin_data, 30.0);
        return p;
      },
      py::arg("argv"), py::kw_only(), py::arg("env"), py::arg("cwd"), py::arg("timeout_s") = py::none(),
      py::arg("limits"), py::arg("output_cap_bytes"), py::arg("stdin") = py::none(), py::arg("uid") = py::none(),
      py::arg("gid") = py::none(), py::arg("sweep_uid") = true, py::arg("die_with_parent_thread") = false,
      py::arg("pass_fds") = std::vector<int>(), py::arg("new_netns") = false, py::arg("nice") = 0,
      py::arg("new_ipcns") = false, py::arg("oom_score_adj") = py::none(), py::arg("cgroup_procs") = "",
      py::arg("userns") = false, py::arg("writable_dir") = "", py::arg("shm_bytes") = 1LL << 30,
      "Like run() but returns a Process at once (stdin is a pipe). pass_fds: our descriptors, handed over as the "
      "child's 3, 4, ... (every other one is closed). new_netns: the child gets an empty network namespace "
      "(needs CAP_SYS_ADMIN; fails to start otherwise). nice: 0..19, a lower CPU priority for the child. timeout_s here caps the child's whole lifetime "
      "(None: no cap); Process.wait(timeout_s) adds a per-wait limit. The cap and the waits are enforced by this "
      "process: die_with_parent_thread=True (PR_SET_PDEATHSIG) kills the child when the calling thread ends, "
      "process death included; only for callers whose thread outlives the child.");

  m.def("kill_uid", &kill_uid, py::arg("uid"), py::call_guard<py::gil_scoped_release>(),
        "Kill every process of this uid (refuses 0 and our own uid). Returns how many are still alive.");
  m.def("count_uid_processes", &count_uid_processes, py::arg("uid"), py::call_guard<py::gil_scoped_release>(),
        "Live (non-zombie) processes whose real uid is uid.");

  py::class_<CudaTimer>(m, "CudaTimer")
      .def(py::init([](std::optional<std::string> lib_path) {
             return std::make_unique<CudaTimer>(lib_path.value_or(""), wheel_lib_dirs());
           }),
           py::arg("lib_path") = py::none(),
           "lib_path: libcudart to use; None: the one already loaded in this process (e.g. by torch), else the "
           "nvidia pip wheels', else the system's. Nothing is loaded until first use.")
      .def(
          "time",
          [](CudaTimer& self, const py::function& fn, int warmup, int reps, long long l2_flush_bytes,
             bool sync_device, std::uintptr_t stream) {
            std::vector<double> out;
            {
              py::gil_scoped_release release;
              out = self.time(
                  [&fn]() {
                    py::gil_scoped_acquire acquire;
                    fn();
                  },
                  warmup, reps, l2_flush_bytes, sync_device, reinterpret_cast<void*>(stream));
            }
            return out;
          },
          py::arg("fn"), py::kw_only(), py::arg("warmup"), py::arg("reps"), py::arg("l2_flush_bytes") = -1,
          py::arg("sync_device") = true, py::arg("stream") = 0,
          "Milliseconds per rep of fn(). l2_flush_bytes: scratch memset before each rep (-1: 2x the L2 size, 0: "
          "none). stream: a cudaStream_t as int (torch.cuda.Stream.cuda_stream); 0 = legacy default stream. "
          "The GIL is released except while fn runs.")
      .def_property_readonly("lib_path", &CudaTimer::lib_path);

  m.def(
      "device_properties",
      [](std::optional<int> device, std::optional<std::string> lib_path) {
        CudaRuntime& rt = CudaRuntime::get(lib_path.value_or(""), wheel_lib_dirs());
        int dev = device ? *device : rt.current_device();
        DeviceProperties p = rt.properties(dev);
        py::dict d;
        d["name"] = p.name;
        d["l2_cache_bytes"] = p.l2_cache_bytes;
        d["sm_count"] = p.sm_count;
        d["major"] = p.major;
        d["minor"] = p.minor;
        d["device"] = p.device;
        d["cudart"] = rt.path();
        return d;
      },
      py::arg("device") = py::none(), py::arg("lib_path") = py::none(),
      "dict(name, l2_cache_bytes, sm_count, major, minor, device, cudart) through the dlopen'ed runtime. Raises "
      "RuntimeError without a CUDA runtime or device.");

  m.def("digest_values", &digest_values, py::arg("ptr"), py::arg("sizes"), py::arg("strides"), py::arg("itemsize"),
        py::arg("key"),
        "(values, n_words) of the output digest (device_kernels.py) over a host tensor's memory: data_ptr, sizes, "
        "strides in elements, element size in bytes. The caller keeps the tensor alive.");

  m.def(
      "find_cudart",
      [](std::optional<std::string> lib_path) { return find_cudart(lib_path.value_or(""), wheel_lib_dirs(), nullptr); },
      py::arg("lib_path") = py::none(),
      "The libcudart path CudaTimer would load ('' when only the system loader search is left). Loads nothing.");
}
