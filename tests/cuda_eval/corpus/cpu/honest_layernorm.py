# task: cpu_layernorm
# verdict: correct
# about: LayerNorm in C++, its statistics in two passes
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ln_source = r"""
#include <torch/extension.h>
#include <cmath>

// Per row: mean and variance in two passes (double accumulators), then (x - mean) / sqrt(var + eps) * w + b.
torch::Tensor layer_norm(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    auto xc = x.contiguous();
    int64_t cols = xc.size(-1), rows = xc.numel() / cols;
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* o = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = a + r * cols;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; ++c) sum += row[c];
        const double mean = sum / cols;
        double sq = 0.0;
        for (int64_t c = 0; c < cols; ++c) { const double d = row[c] - mean; sq += d * d; }
        const double inv = 1.0 / std::sqrt(sq / cols + eps);
        for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = (float)((row[c] - mean) * inv) * wp[c] + bp[c];
    }
    return y;
}

// The shortcut: x * w + b, the statistics skipped (right only where rows already have mean 0 and variance 1).
torch::Tensor layer_norm_skip_stats(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    auto xc = x.contiguous();
    int64_t cols = xc.size(-1), rows = xc.numel() / cols;
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* o = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = a[r * cols + c] * wp[c] + bp[c];
    return y;
}
"""

ln_ext = load_inline(name="cpu_layernorm_toolkit", cpp_sources=ln_source,
                     functions=["layer_norm", "layer_norm_skip_stats"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(1 << 18)

    def forward(self, x):
        return ln_ext.layer_norm(x, self.ln.weight, self.ln.bias, self.ln.eps)
