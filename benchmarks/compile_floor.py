"""What one CUDA unit costs by what it includes: the floor under the compile stage's CPU per new candidate.

    python benchmarks/compile_floor.py                                   # the table below, nvcc included
    python benchmarks/compile_floor.py --lines-only                      # preprocessed line counts only (seconds)
    python benchmarks/compile_floor.py --candidate benchmarks/candidates/gemv.py

Units, each compiled as the compile stage compiles a candidate's cuda.cu (`nvcc -c` with the toolchain's flags for
load_inline, the candidate's program read by static_record.static_record_specs, its light header from
sources.light_header_text):
  1. a plain kernel and its launch, no torch;
  2. the same launch from a host function over `at::Tensor` (`#include <ATen/core/Tensor.h>` only);
  3. 2 plus one ATen operator header (ATen/ops/empty_like.h: how nearly every candidate allocates its output);
  4. the candidate's own cuda.cu with its light header and torch's operator headers;
  5. the same with the lean operator headers (sources.lean_op_headers: less ATen/Context.h and ATen/DeviceGuard.h),
     as the build writes it;
  6. for comparison, the same launch from a unit that includes `<torch/extension.h>` (what load_inline's sources
     include; the light header replaces it).
Per unit: the lines every front end parses (`g++ -E` with the same includes), the CPU seconds of the whole nvcc
run (the rusage of the waited-for children: cudafe++, cicc, the host compile ...) and its peak memory: the largest
resident set of any one of its processes (their phases run one after another, so this is what one build holds at
once; kevin_jax.placement counts builds by it). CPU seconds, not wall: run it on an idle machine or read the CPU
column only.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuda_eval.compile import sources, toolchain  # noqa: E402
from cuda_eval.compile.build_dirs import write_private_tree  # noqa: E402
from cuda_eval.static import static_record  # noqa: E402

KERNEL = """__global__ void add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
"""
PLAIN = "#include <cuda_runtime.h>\n" + KERNEL + """void launch(const float* a, const float* b, float* c, int n) {
  add<<<(n + 255) / 256, 256>>>(a, b, c, n);
}
"""
TENSOR = "#include <ATen/core/Tensor.h>\n#include <cuda_runtime.h>\n" + KERNEL + """void launch(const at::Tensor& a,
    const at::Tensor& b, at::Tensor& c) {
  int n = a.numel();
  add<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n);
}
"""
TENSOR_OP = TENSOR.replace("#include <ATen/core/Tensor.h>\n",
                           "#include <ATen/core/Tensor.h>\n#include <ATen/ops/empty_like.h>\n", 1)
EXTENSION = TENSOR.replace("#include <ATen/core/Tensor.h>\n", "#include <torch/extension.h>\n", 1)

# Runs a command and prints its CPU seconds and the largest resident set of its processes (a fresh process, so
# that the maximum is this command's alone: RUSAGE_CHILDREN keeps the largest child ever waited for).
MEASURE = """import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stderr.write(proc.stderr)
print(proc.returncode, r.ru_utime + r.ru_stime, r.ru_maxrss * 1024)
"""


LEAN = "with the lean operator headers"


def units(candidate_path: pathlib.Path, tc: toolchain.Toolchain) -> tuple[dict[str, str], str, dict[str, str]]:
    """{label: .cu source}, the candidate's light header text and its lean operator headers."""
    specs = static_record.static_record_specs(candidate_path.read_text())
    if not specs:
        raise SystemExit(f"{candidate_path}: its builds cannot be read from its source; pick a plainer candidate")
    spec = specs[0]
    header, why = sources.light_header_text([*spec.cuda_sources, *spec.cpp_sources], tc)
    if header is None:
        raise SystemExit(f"{candidate_path}: no light-header build ({why})")
    lean = sources.lean_op_headers([*spec.cuda_sources, *spec.cpp_sources], header, tc)
    if not lean:
        raise SystemExit(f"{candidate_path}: its sources keep torch's own operator headers; pick a plainer candidate")
    return {"plain kernel, no torch": PLAIN,
            "host function over at::Tensor (ATen/core/Tensor.h)": TENSOR,
            "+ one operator header (ATen/ops/empty_like.h)": TENSOR_OP,
            f"{candidate_path.name}'s cuda.cu with its light header": sources.cuda_cu(spec, light=True),
            f"the same {LEAN}": sources.cuda_cu(spec, light=True),
            "the launch of 2 under torch/extension.h (no light header)": EXTENSION}, header, lean


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--candidate", type=pathlib.Path, default=REPO / "benchmarks" / "candidates" / "layernorm.py")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--lines-only", action="store_true", help="skip nvcc: preprocessed line counts only")
    args = p.parse_args(argv)

    tc = toolchain.detect(args.arch)
    cuda_flags = tc.flags("floor", with_cuda=True)["cuda_cflags"]
    includes = [f"-I{cuda_flags[i + 1]}" for i, f in enumerate(cuda_flags[:-1]) if f == "-isystem"]
    includes += [f for f in cuda_flags if f.startswith("-I")]
    std = next((f for f in cuda_flags if f.startswith("-std=")), "-std=c++17")
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile_floor-") as tmp:
        work = pathlib.Path(tmp)
        unit_texts, header, lean = units(args.candidate, tc)
        (work / sources.LIGHT_HEADER).write_text(header)
        write_private_tree(str(work / sources.LEAN_DIR), lean)
        for k, (label, src) in enumerate(unit_texts.items()):
            cu = work / f"unit{k}.cu"
            cu.write_text(src)
            lean_inc = [f"-I{work / sources.LEAN_DIR}"] if label.endswith(LEAN) else []
            pre = subprocess.run(["g++", std, "-x", "c++", "-E", str(cu), *lean_inc, f"-I{work}", *includes],
                                 capture_output=True, text=True)
            lines = pre.stdout.count("\n") if pre.returncode == 0 else None
            cpu = peak = None
            if not args.lines_only:
                proc = subprocess.run([sys.executable, "-c", MEASURE, tc.nvcc, *lean_inc, *cuda_flags, f"-I{work}",
                                       "-c", str(cu), "-o", str(work / "u.o")], capture_output=True, text=True)
                rc, cpu, peak = proc.stdout.split()
                if rc != "0":
                    raise SystemExit(f"nvcc failed on {label}:\n{proc.stderr[-3000:]}")
                cpu, peak = float(cpu), int(peak)
            rows.append((label, lines, cpu, peak))

    print(f"toolchain: nvcc {tc.nvcc_version}, torch {tc.torch_version}, arch {tc.arch}\n")
    print("| unit | lines after preprocessing | CPU-s (nvcc, all phases) | peak memory GiB (its largest process) |")
    print("|---|---|---|---|")
    for label, lines, cpu, peak in rows:
        print(f"| {label} | {'-' if lines is None else f'{lines:,}'} | {'-' if cpu is None else f'{cpu:.1f}'} | "
              f"{'-' if peak is None else f'{peak / 2**30:.2f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
