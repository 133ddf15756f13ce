#include <cstdio>
#include <cstring>
#include "cuda_occupancy.h"
int main() {
  struct Dev { int major, minor, thr_sm; size_t smem_sm, optin; } devs[] = {
    {9, 0, 2048, 233472, 232448}, {8, 0, 2048, 167936, 166912}, {8, 6, 1536, 102400, 101376}, {8, 9, 1536, 102400, 101376}, {7, 0, 2048, 98304, 98304}, {10, 0, 2048, 233472, 232448}, {12, 0, 1536, 102400, 101376}};
  int blocks[] = {32, 64, 96, 128, 192, 256, 384, 512, 640, 768, 1024};
  int regs[] = {0, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 128, 168, 200, 255};
  size_t smems[] = {0, 1088, 4224, 8192, 16384, 32768, 49152, 65536, 100000, 160000, 227000};
  for (auto& d : devs) {
    cudaOccDeviceProp p; memset(&p, 0, sizeof p);
    p.computeMajor = d.major; p.computeMinor = d.minor; p.maxThreadsPerBlock = 1024; p.maxThreadsPerMultiprocessor = d.thr_sm;
    p.regsPerBlock = 65536; p.regsPerMultiprocessor = 65536; p.warpSize = 32; p.sharedMemPerBlock = 49152;
    p.sharedMemPerMultiprocessor = d.smem_sm; p.numSms = 132; p.sharedMemPerBlockOptin = d.optin; p.reservedSharedMemPerBlock = d.major >= 8 ? 1024 : 0;
    for (int b : blocks) for (int r : regs) for (size_t s : smems) {
      if (s > d.optin) continue;
      cudaOccFuncAttributes a; memset(&a, 0, sizeof a);
      a.maxThreadsPerBlock = 1024; a.numRegs = r; a.sharedSizeBytes = s / 2; a.partitionedGCConfig = PARTITIONED_GC_OFF;
      a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN; a.maxDynamicSharedSizeBytes = d.optin;
      cudaOccDeviceState st; memset(&st, 0, sizeof st); st.carveoutConfig = SHAREDMEM_CARVEOUT_DEFAULT; st.cacheConfig = CACHE_PREFER_NONE;
      cudaOccResult res; memset(&res, 0, sizeof res);
      if (cudaOccMaxActiveBlocksPerMultiprocessor(&res, &p, &a, &st, b, s - s / 2) != CUDA_OCC_SUCCESS) { printf("ERR\n"); continue; }
      printf("%d %d %d %d %zu %zu %d\n", d.major, d.minor, b, r, s / 2, s - s / 2, res.activeBlocksPerMultiprocessor);
    }
  }
}
