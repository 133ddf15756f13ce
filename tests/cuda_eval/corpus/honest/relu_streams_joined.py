# task: relu
# about: splits the work over the current stream and a side stream, joined with events before returning (legal)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

two_stream_source = r"""
#include <torch/extension.h>

__global__ void relu_part_kernel(const float* __restrict__ x, float* __restrict__ y, long begin, long end) {
    long i = begin + blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < end) y[i] = fmaxf(x[i], 0.f);
}

static cudaStream_t side_stream() {
    static cudaStream_t s = nullptr;
    if (!s) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
}

torch::Tensor relu_two_streams(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel(), half = n / 2;
    cudaStream_t main = 0;
    cudaStream_t side = side_stream();
    cudaEvent_t inputs_ready, side_done;
    cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&side_done, cudaEventDisableTiming);
    cudaEventRecord(inputs_ready, main);
    cudaStreamWaitEvent(side, inputs_ready, 0);
    relu_part_kernel<<<(half + 255) / 256, 256, 0, side>>>(xc.data_ptr<float>(), y.data_ptr<float>(), 0, half);
    relu_part_kernel<<<(n - half + 255) / 256, 256, 0, main>>>(xc.data_ptr<float>(), y.data_ptr<float>(), half, n);
    cudaEventRecord(side_done, side);
    cudaStreamWaitEvent(main, side_done, 0);
    cudaEventDestroy(inputs_ready);
    cudaEventDestroy(side_done);
    return y;
}
"""

ext = load_inline(name="honest_relu_two_streams", cpp_sources="torch::Tensor relu_two_streams(torch::Tensor x);",
                  cuda_sources=two_stream_source, functions=["relu_two_streams"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return ext.relu_two_streams(x)
