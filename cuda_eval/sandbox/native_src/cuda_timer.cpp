// See cuda_timer.h. Only the runtime API's C ABI is used (ints for cudaError_t / attributes, void* for handles),
// so no CUDA header is needed at build time.
#include "cuda_timer.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace cuda_eval {
namespace {

// cudaDeviceAttr values (driver_types.h; stable across CUDA 11-13).
constexpr int kAttrMultiProcessorCount = 16;
constexpr int kAttrL2CacheSize = 38;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

std::string cudart_from_proc_maps() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    size_t base = path.rfind('/');
    if (path.compare(base + 1, 12, "libcudart.so") == 0) return path;
  }
  return "";
}

template <typename T>
void bind(void* handle, T& fn, std::initializer_list<const char*> names, bool required, const std::string& path) {
  for (const char* name : names) {
    if (void* sym = dlsym(handle, name)) {
      fn = reinterpret_cast<T>(sym);
      return;
    }
  }
  if (required) throw std::runtime_error(std::string("symbol ") + *names.begin() + " missing from " + path);
}

}  // namespace

std::string find_cudart(const std::string& explicit_path, const std::vector<std::string>& search_dirs,
                        std::vector<std::string>* tried) {
  auto try_path = [&](const std::string& p) -> bool {
    if (tried) tried->push_back(p);
    return !p.empty() && access(p.c_str(), R_OK) == 0;
  };
  if (!explicit_path.empty()) return try_path(explicit_path) ? explicit_path : "";
  std::string mapped = cudart_from_proc_maps();
  if (!mapped.empty()) {
    if (tried) tried->push_back(mapped + " (already loaded)");
    return mapped;
  }
  // e.g. the nvidia-cuda-runtime pip wheel: <site-packages>/nvidia/<pkg>/lib/libcudart.so.<major>
  for (const auto& dir : search_dirs) {
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    std::string found;
    while (dirent* e = readdir(d)) {
      if (strncmp(e->d_name, "libcudart.so", 12) == 0 && (found.empty() || e->d_name < found)) found = e->d_name;
    }
    closedir(d);
    if (!found.empty() && try_path(dir + "/" + found)) return dir + "/" + found;
  }
  return "";
}

CudaRuntime& CudaRuntime::get(const std::string& path, const std::vector<std::string>& search_dirs) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<CudaRuntime>> loaded;
  std::lock_guard<std::mutex> lk(mu);
  auto it = loaded.find(path);
  if (it != loaded.end()) return *it->second;

  std::vector<std::string> tried;
  std::string resolved = find_cudart(path, search_dirs, &tried);
  void* handle = nullptr;
  if (!resolved.empty()) {
    handle = dlopen(resolved.c_str(), RTLD_NOW | RTLD_GLOBAL);
  } else if (path.empty()) {
    // Let the dynamic loader search (LD_LIBRARY_PATH, ld.so.cache), newest ABI first.
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                             "/usr/local/cuda/lib64/libcudart.so"}) {
      tried.push_back(name);
      handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (handle) {
        resolved = name;
        break;
      }
    }
  }
  if (!handle) {
    std::string msg = "cannot load libcudart (no CUDA runtime on this machine?); tried:";
    for (const auto& t : tried) msg += " " + t;
    const char* err = dlerror();
    if (err) msg += std::string("; last dlerror: ") + err;
    throw std::runtime_error(msg);
  }
  auto rt = std::unique_ptr<CudaRuntime>(new CudaRuntime());
  rt->handle_ = handle;
  rt->path_ = resolved;
  bind(handle, rt->GetDevice, {"cudaGetDevice"}, true, resolved);
  bind(handle, rt->GetDeviceCount, {"cudaGetDeviceCount"}, true, resolved);
  bind(handle, rt->DeviceGetAttribute, {"cudaDeviceGetAttribute"}, true, resolved);
  bind(handle, rt->GetDeviceProperties, {"cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"}, true, resolved);
  bind(handle, rt->DeviceSynchronize, {"cudaDeviceSynchronize"}, true, resolved);
  bind(handle, rt->StreamSynchronize, {"cudaStreamSynchronize"}, true, resolved);
  bind(handle, rt->Malloc, {"cudaMalloc"}, true, resolved);
  bind(handle, rt->Free, {"cudaFree"}, true, resolved);
  bind(handle, rt->MemsetAsync, {"cudaMemsetAsync"}, true, resolved);
  bind(handle, rt->EventCreate, {"cudaEventCreate"}, true, resolved);
  bind(handle, rt->EventDestroy, {"cudaEventDestroy"}, true, resolved);
  bind(handle, rt->EventRecord, {"cudaEventRecord"}, true, resolved);
  bind(handle, rt->EventSynchronize, {"cudaEventSynchronize"}, true, resolved);
  bind(handle, rt->EventElapsedTime, {"cudaEventElapsedTime"}, true, resolved);
  bind(handle, rt->GetErrorString, {"cudaGetErrorString"}, true, resolved);
  bind(handle, rt->RuntimeGetVersion, {"cudaRuntimeGetVersion"}, false, resolved);
  CudaRuntime& ref = *rt;
  loaded[path] = std::move(rt);
  return ref;
}

void CudaRuntime::check(int err, const char* what) const {
  if (err == 0) return;
  const char* msg = GetErrorString ? GetErrorString(err) : "unknown error";
  throw std::runtime_error(std::string(what) + " failed: " + (msg ? msg : "?") + " (cudaError " +
                           std::to_string(err) + ")");
}

int CudaRuntime::current_device() const {
  int count = 0;
  check(GetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0) throw std::runtime_error("no CUDA device visible");
  int dev = 0;
  check(GetDevice(&dev), "cudaGetDevice");
  return dev;
}

DeviceProperties CudaRuntime::properties(int device) const {
  DeviceProperties p;
  p.device = device;
  int value = 0;
  check(DeviceGetAttribute(&value, kAttrL2CacheSize, device), "cudaDeviceGetAttribute(L2CacheSize)");
  p.l2_cache_bytes = value;
  check(DeviceGetAttribute(&value, kAttrMultiProcessorCount, device), "cudaDeviceGetAttribute(SM count)");
  p.sm_count = value;
  check(DeviceGetAttribute(&value, kAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute(major)");
  p.major = value;
  check(DeviceGetAttribute(&value, kAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute(minor)");
  p.minor = value;
  // cudaDeviceProp's layout changes between versions, but `char name[256]` is its first member in all of them.
  // The buffer is far larger than any version's struct.
  std::vector<char> prop(1 << 16, 0);
  check(GetDeviceProperties(prop.data(), device), "cudaGetDeviceProperties");
  p.name.assign(prop.data(), strnlen(prop.data(), 256));
  return p;
}

CudaTimer::CudaTimer(const std::string& lib_path, std::vector<std::string> search_dirs)
    : requested_path_(lib_path), search_dirs_(std::move(search_dirs)) {}

CudaTimer::~CudaTimer() {
  if (!rt_) return;
  // Best effort: the process may be tearing down CUDA already.
  if (start_) rt_->EventDestroy(start_);
  if (end_) rt_->EventDestroy(end_);
  if (scratch_) rt_->Free(scratch_);
}

const std::string& CudaTimer::lib_path() const {
  static const std::string none;
  return rt_ ? rt_->path() : none;
}

void CudaTimer::ensure_runtime() {
  if (!rt_) rt_ = &CudaRuntime::get(requested_path_, search_dirs_);
}

void CudaTimer::ensure_scratch(long long bytes) {
  int dev = rt_->current_device();
  if (scratch_ && (scratch_bytes_ < bytes || scratch_device_ != dev)) {
    rt_->Free(scratch_);
    scratch_ = nullptr;
  }
  if (!scratch_) {
    rt_->check(rt_->Malloc(&scratch_, static_cast<size_t>(bytes)), "cudaMalloc(L2 flush buffer)");
    scratch_bytes_ = bytes;
    scratch_device_ = dev;
  }
}

std::vector<double> CudaTimer::time(const std::function<void()>& fn, int warmup, int reps, long long l2_flush_bytes,
                                    bool sync_device, void* stream) {
  if (warmup < 0 || reps <= 0) throw std::invalid_argument("need warmup >= 0 and reps >= 1");
  ensure_runtime();
  int dev = rt_->current_device();
  if (l2_flush_bytes < 0) l2_flush_bytes = 2 * rt_->properties(dev).l2_cache_bytes;
  if (l2_flush_bytes > 0) ensure_scratch(l2_flush_bytes);
  if (start_ && events_device_ != dev) {
    // Events belong to the device that was current when they were created.
    rt_->EventDestroy(start_);
    rt_->EventDestroy(end_);
    start_ = end_ = nullptr;
  }
  if (!start_) {
    rt_->check(rt_->EventCreate(&start_), "cudaEventCreate");
    rt_->check(rt_->EventCreate(&end_), "cudaEventCreate");
    events_device_ = dev;
  }
  auto sync = [&](const char* what) {
    if (sync_device)
      rt_->check(rt_->DeviceSynchronize(), what);
    else
      rt_->check(rt_->StreamSynchronize(stream), what);
  };
  for (int i = 0; i < warmup; ++i) fn();
  rt_->check(rt_->DeviceSynchronize(), "cudaDeviceSynchronize after warm-up");
  std::vector<double> times;
  times.reserve(reps);
  for (int i = 0; i < reps; ++i) {
    if (l2_flush_bytes > 0)
      rt_->check(rt_->MemsetAsync(scratch_, i & 0xff, static_cast<size_t>(l2_flush_bytes), stream),
                 "cudaMemsetAsync(L2 flush)");
    sync("synchronize before timing");
    rt_->check(rt_->EventRecord(start_, stream), "cudaEventRecord(start)");
    fn();
    if (sync_device) rt_->check(rt_->DeviceSynchronize(), "cudaDeviceSynchronize after the timed call");
    rt_->check(rt_->EventRecord(end_, stream), "cudaEventRecord(end)");
    rt_->check(rt_->EventSynchronize(end_), "cudaEventSynchronize(end)");
    float ms = 0;
    rt_->check(rt_->EventElapsedTime(&ms, start_, end_), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  return times;
}

}  // namespace cuda_eval
