"""The physics floor and the roofline (cuda_eval/judge/floor.py): the bytes a call must move and the FLOPs it must do,
found from the reference on the CPU, and the arithmetic of the floor, the flag decision and peak_fraction."""
import hashlib

import pytest
import torch

from cuda_eval.judge import floor


def _digest(out) -> str:
    return hashlib.sha256(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes()
                                   for t in floor._tensors([out]))).hexdigest()


def _needs(model, make_inputs):
    gen = iter(range(100))

    def fresh():
        torch.manual_seed(next(gen))
        return make_inputs()

    def run(inputs):
        torch.manual_seed(0)
        with torch.no_grad():
            return model(*inputs)
    params = list(model.parameters()) + list(model.buffers())
    return floor.needs(run, fresh(), fresh, params, _digest)


class _Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 32)
        self.unused = torch.nn.Parameter(torch.randn(1000))   # a weight the forward never reads

    def forward(self, x):
        return self.lin(x)


class _FirstColumns(torch.nn.Module):
    def forward(self, x, y):
        return x[:, :4] * 2.0          # reads a slice of x, and y not at all


class _SoftmaxOfMean(torch.nn.Module):
    def forward(self, x, y):            # softmax over a dimension of size one: ones, whatever x is; y counts
        return torch.softmax(x.mean(dim=1, keepdim=True), dim=1) + y


def test_bytes_of_an_elementwise_call_are_its_input_and_output():
    n = _needs(_Relu(), lambda: [torch.randn(128, 256)])
    assert (n.input_bytes, n.output_bytes, n.param_bytes) == (128 * 256 * 4, 128 * 256 * 4, 0)
    assert n.flops is None and n.bytes == 2 * 128 * 256 * 4


def test_a_linear_layer_counts_its_weights_flops_and_no_unused_parameter():
    n = _needs(_Linear(), lambda: [torch.randn(16, 64)])
    assert n.param_bytes == (64 * 32 + 32) * 4           # the unused 1000 floats are never read
    assert n.input_bytes == 16 * 64 * 4 and n.output_bytes == 16 * 32 * 4
    assert n.flops == 2 * 16 * 64 * 32


def test_only_what_the_output_depends_on_is_read():
    n = _needs(_FirstColumns(), lambda: [torch.randn(64, 100), torch.randn(64, 100)])
    assert n.input_bytes == 64 * 4 * 4                    # the slice, not the whole of x; y is never read
    m = _needs(_SoftmaxOfMean(), lambda: [torch.randn(64, 100), torch.randn(64, 1)])
    assert m.inputs_perturbed and m.independent_leaves == 1 and m.input_bytes == 64 * 4


def test_a_broadcast_output_counts_its_storage():
    t = torch.zeros(1, 8).expand(1000, 8)
    assert floor.tensor_bytes(t) == 32


def test_floor_arithmetic():
    # 512 MiB moved, 50 MiB L2: (512 - 100) MiB at 1.5 x 3 TB/s
    assert floor.floor_ms(512 << 20, 3.0e12, 50 << 20) == pytest.approx(412 * 2**20 / 4.5e12 * 1e3)
    assert floor.floor_ms(64 << 20, 3.0e12, 50 << 20) == 0.0      # fits in two L2's worth: no floor
    assert floor.floor_ms(512 << 20, None, 50 << 20) is None


def test_roofline_and_peak_fraction():
    # memory-bound: 1 GB at 4 TB/s = 0.25 ms; a kernel of 0.5 ms reached half the roofline
    roof = floor.roofline_ms(10 ** 9, 1e9, 4.0e12, 800e12)
    assert roof == pytest.approx(0.25) and floor.peak_fraction(roof, 0.5) == pytest.approx(0.5)
    # compute-bound: 2 * 8192^3 FLOPs at 800 TFLOP/s
    flops = 2 * 8192 ** 3
    roof = floor.roofline_ms(3 * 8192 * 8192 * 2, flops, 4.0e12, 800e12)
    assert roof == pytest.approx(flops / 800e12 * 1e3)
    assert floor.roofline_ms(1000, None, None, None) is None and floor.peak_fraction(None, 1.0) is None
    assert floor.roofline_ms(10 ** 9, 1e12, 4.0e12, None) == pytest.approx(0.25)   # no peak measured: bytes only


class _CancelledGemm(torch.nn.Module):
    """A GEMM whose result a later reduction cancels (KernelBench L2 has such tasks): the output is zeros whatever
    the weights and inputs, so a kernel may write zeros and read nothing."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 32)

    def forward(self, x):
        y = self.lin(x).max(dim=1, keepdim=True).values
        return y - y.mean(dim=1, keepdim=True)


def test_weights_and_inputs_the_output_does_not_depend_on_are_not_needed():
    model = _CancelledGemm()
    before = [p.detach().clone() for p in model.parameters()]
    n = _needs(model, lambda: [torch.randn(16, 64)])
    assert not n.params_needed and n.param_bytes == 0 and n.input_bytes == 0 and n.output_bytes == 16 * 4
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))   # restored bit for bit
    assert _needs(_Linear(), lambda: [torch.randn(16, 64)]).params_needed
