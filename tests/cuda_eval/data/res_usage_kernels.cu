#include <cstdio>
__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
template <int TILE>
__global__ void tiled_kernel(const float* a, float* out, int n) {
    __shared__ float tile[TILE][TILE + 1];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x % TILE][threadIdx.x / TILE % TILE] = i < n ? a[i] : 0.f;
    __syncthreads();
    if (i < n) out[i] = tile[threadIdx.x / TILE % TILE][threadIdx.x % TILE];
}
__global__ void spill_kernel(const float* a, float* out, int n, int k) {
    float local[64];
    for (int j = 0; j < 64; ++j) local[j] = a[(j * 7 + threadIdx.x) % n];
    out[threadIdx.x] = local[k % 64] + local[(k * 3) % 64];
}
namespace ns { __global__ void inner_kernel(double* x) { x[threadIdx.x] *= 2.0; } }
extern "C" __global__ void c_kernel(float* x) { x[threadIdx.x] += 1.f; }
void launch(const float* a, const float* b, float* o, int n) {
  add_kernel<<<(n + 255) / 256, 256>>>(a, b, o, n);
  tiled_kernel<32><<<1, 1024>>>(a, o, n);
  tiled_kernel<16><<<1, 256>>>(a, o, n);
  spill_kernel<<<1, 32>>>(a, o, n, 3);
  ns::inner_kernel<<<1,1>>>(nullptr);
  c_kernel<<<1,1>>>(nullptr);
}
