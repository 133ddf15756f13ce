// CUDA event timer with libcudart loaded by dlopen at first use, so that the module imports (and everything else
// works) on machines with no GPU and no CUDA installed.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cuda_eval {

struct DeviceProperties {
  std::string name;
  long long l2_cache_bytes = 0;
  int sm_count = 0;
  int major = 0, minor = 0;
  int device = 0;
};

// The subset of the runtime API we use, resolved with dlsym from one libcudart.
class CudaRuntime {
 public:
  // Loads `path`, or (empty) the libcudart already mapped into this process (e.g. by torch), else the nvidia pip
  // wheels' lib dirs and the system's. Throws std::runtime_error with the places tried.
  // search_dirs: extra directories that may hold libcudart.so* (pip wheels), tried after the mapped one.
  static CudaRuntime& get(const std::string& path, const std::vector<std::string>& search_dirs);
  const std::string& path() const { return path_; }

  void check(int err, const char* what) const;  // throws std::runtime_error("<what>: <cudaGetErrorString>")
  int current_device() const;
  DeviceProperties properties(int device) const;

  int (*GetDevice)(int*) = nullptr;
  int (*GetDeviceCount)(int*) = nullptr;
  int (*DeviceGetAttribute)(int*, int, int) = nullptr;
  int (*GetDeviceProperties)(void*, int) = nullptr;
  int (*DeviceSynchronize)() = nullptr;
  int (*StreamSynchronize)(void*) = nullptr;
  int (*Malloc)(void**, size_t) = nullptr;
  int (*Free)(void*) = nullptr;
  int (*MemsetAsync)(void*, int, size_t, void*) = nullptr;
  int (*EventCreate)(void**) = nullptr;
  int (*EventDestroy)(void*) = nullptr;
  int (*EventRecord)(void*, void*) = nullptr;
  int (*EventSynchronize)(void*) = nullptr;
  int (*EventElapsedTime)(float*, void*, void*) = nullptr;
  const char* (*GetErrorString)(int) = nullptr;
  int (*RuntimeGetVersion)(int*) = nullptr;

 private:
  std::string path_;
  void* handle_ = nullptr;
};

// Finds the libcudart path the same way CudaRuntime::get does, without loading it ("" if none found).
std::string find_cudart(const std::string& explicit_path, const std::vector<std::string>& search_dirs,
                        std::vector<std::string>* tried);

class CudaTimer {
 public:
  CudaTimer(const std::string& lib_path, std::vector<std::string> search_dirs);
  ~CudaTimer();
  CudaTimer(const CudaTimer&) = delete;
  CudaTimer& operator=(const CudaTimer&) = delete;

  // Per rep: flush L2 (memset of a scratch buffer, outside the timed region), synchronize, record start, fn(),
  // synchronize the device (so side-stream and background work counts), record end, synchronize, elapsed.
  // `fn` is called with whatever locking the caller arranged (the binding holds the GIL for it).
  std::vector<double> time(const std::function<void()>& fn, int warmup, int reps, long long l2_flush_bytes,
                           bool sync_device, void* stream);
  const std::string& lib_path() const;

 private:
  void ensure_runtime();
  void ensure_scratch(long long bytes);
  std::string requested_path_;
  std::vector<std::string> search_dirs_;
  CudaRuntime* rt_ = nullptr;
  void* scratch_ = nullptr;
  long long scratch_bytes_ = 0;
  int scratch_device_ = -1;
  int events_device_ = -1;
  void* start_ = nullptr;
  void* end_ = nullptr;
};

}  // namespace cuda_eval
