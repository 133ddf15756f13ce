"""Every KernelBench task through the full judge, with a candidate made from the task itself: does any end as an
internal evaluator error, are the honest candidates correct and the wrong ones incorrect, and what does each cost?

    python benchmarks/kernelbench_sweep.py --root ../shared/kernelbench --out $OUT/kb_sweep.json           # a GPU
    python benchmarks/kernelbench_sweep.py --root ../shared/kernelbench --quick --order largest-first \\
        --budget-s 540 --out $OUT/kb_sweep.json                                    # a time-boxed GPU run
    python benchmarks/kernelbench_sweep.py --root /work/shared/kernelbench --mode compile_only \\
        --out /tmp/kb_sweep.json                                     # no GPU: every program parsed, checked, built
    python benchmarks/kernelbench_sweep.py --root ../shared/kernelbench --dry-run   # the jobs and sizes, nothing run

The honest candidate of a task is its own source (class Model, constants, get_inputs) plus a ModelNew that runs the
reference forward and returns every output tensor copied by one custom CUDA kernel (load_inline, as model answers
build theirs). The CUDA source is the same for every task (a byte copy, 16 bytes at a time where aligned), so it is
compiled once and every other candidate is a cache hit. The wrong candidate is the same program with WRONG = True: the
copy then changes one element of the first output tensor beyond any tolerance. `--wrong N` tasks get one, spread over
the levels. Under the kernelbench profile (the default) the honest ones must be correct (their PyTorch ops are
advisory flags there) and the wrong ones incorrect; `--quick` uses Kevin's profile with the static reject off, a few
timing repetitions and `--trials` correctness trials, and counts an honest candidate as ok when it is correct.

Per task: the verdict's class, the wall time (whole request, and the GPU job), the judge's and the worker's peak host
RSS, the output buffer (shared memory), the judge's peak device memory and the card's used memory during the job
(nvidia-smi, sampled), the output size from the task run on PyTorch's meta device. Per level: ok / incorrect /
internal error / too big for the card / other. Rows are appended to <out>.jsonl as verdicts arrive (`--resume`
skips what is there); <out> gets the summary. KernelBench's task files are device data (../shared/kernelbench),
never needed by the tests.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# --- the candidates ---------------------------------------------------------------------------------------------
EXTENSION_NAME = "kernelbench_sweep_copy"
COPY_DECL = "torch::Tensor copy_output(torch::Tensor src, torch::Tensor patch, int64_t patch_at);"
COPY_CUDA = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <stdint.h>

// n bytes from src to dst: 16 at a time where both are 16-byte aligned (the caching allocator's blocks are).
__global__ void copy_bytes_kernel(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                  long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long tail = 0;
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
        const long long n16 = n >> 4;
        const uint4* s = reinterpret_cast<const uint4*>(src);
        uint4* d = reinterpret_cast<uint4*>(dst);
        for (long long i = first; i < n16; i += stride) d[i] = s[i];
        tail = n16 << 4;
    }
    for (long long i = tail + first; i < n; i += stride) dst[i] = src[i];
}

// One element overwritten after the copy (the deliberately wrong variant of the candidate).
__global__ void patch_element_kernel(unsigned char* dst, const unsigned char* patch, long long at, int len) {
    if ((int)threadIdx.x < len) dst[at + threadIdx.x] = patch[threadIdx.x];
}

torch::Tensor copy_output(torch::Tensor src, torch::Tensor patch, int64_t patch_at) {
    TORCH_CHECK(src.is_cuda() && src.is_contiguous(), "copy_output: a contiguous CUDA tensor expected");
    auto dst = torch::empty_like(src, at::MemoryFormat::Contiguous);
    const long long n = (long long)src.numel() * (long long)src.element_size();
    // The default stream, as torch's current one is in the evaluator (and in KernelBench's own example answer).
    if (n > 0) {
        const int threads = 256;
        long long blocks = ((n >> 4) + threads - 1) / threads;
        blocks = blocks < 1 ? 1 : (blocks > 8192 ? 8192 : blocks);
        copy_bytes_kernel<<<(unsigned)blocks, threads>>>(
            static_cast<const unsigned char*>(src.data_ptr()), static_cast<unsigned char*>(dst.data_ptr()), n);
    }
    if (patch.numel() > 0) {
        TORCH_CHECK(patch.is_cuda() && patch.dtype() == src.dtype() && patch.numel() == 1 &&
                    patch_at >= 0 && patch_at < src.numel(), "copy_output: a bad patch");
        patch_element_kernel<<<1, 32>>>(static_cast<unsigned char*>(dst.data_ptr()),
                                     static_cast<const unsigned char*>(patch.data_ptr()),
                                     patch_at * (long long)src.element_size(), (int)src.element_size());
    }
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "copy_output: ", cudaGetErrorString(err));
    return dst;
}
"""
# The same program for CPU mode (C++ on CPU tensors): how the CPU tests check the candidate's Python part.
COPY_CPU = r"""
#include <torch/extension.h>
#include <cstring>

torch::Tensor copy_output(torch::Tensor src, torch::Tensor patch, int64_t patch_at) {
    TORCH_CHECK(src.is_contiguous() && !src.is_cuda(), "copy_output: a contiguous CPU tensor expected");
    auto dst = torch::empty_like(src, at::MemoryFormat::Contiguous);
    const int64_t n = src.numel() * (int64_t)src.element_size();
    if (n > 0) std::memcpy(dst.data_ptr(), src.data_ptr(), (size_t)n);
    if (patch.numel() > 0) {
        TORCH_CHECK(patch.dtype() == src.dtype() && patch.numel() == 1 && patch_at >= 0 && patch_at < src.numel(),
                    "copy_output: a bad patch");
        std::memcpy(static_cast<char*>(dst.data_ptr()) + patch_at * (int64_t)src.element_size(), patch.data_ptr(),
                    (size_t)src.element_size());
    }
    return dst;
}
"""

CANDIDATE_TAIL = '''

# --- the candidate: the reference above, its outputs copied by our own kernel ---
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

WRONG = {wrong}
_copy_source = r"""{source}"""
_copy_ext = load_inline(name="{name}", {sources}, functions=["copy_output"], verbose=False)


def _changed_element(x):
    """One element, changed beyond any tolerance (the wrong variant)."""
    if x.dtype == torch.bool:
        return ~x
    if x.is_floating_point():
        return torch.where(x.abs() < 1, x + 2, x * 3)
    return x + 2 if x.is_complex() else x + 1


def _copied(out, wrong):
    """Every tensor of the output (nested tuples and lists too) copied by the kernel; with `wrong`, the first
    tensor's first element changed."""
    todo = [wrong]

    def walk(x):
        if isinstance(x, (tuple, list)):
            return type(x)(walk(item) for item in x)
        if not isinstance(x, torch.Tensor):
            return x
        src = x.contiguous()
        patch = src.new_empty(0)
        if todo[0] and src.numel():
            patch, todo[0] = _changed_element(src.reshape(-1)[:1]).contiguous(), False
        return _copy_ext.copy_output(src, patch, 0)
    return walk(out)


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.reference = Model(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return _copied(self.reference(*args, **kwargs), WRONG)
'''


def without_docstrings(source: str) -> str:
    """The task's code without its docstrings and comments, as a model's answer that copies the reference class
    usually has it: KernelBench's static checker (and the kernelbench profile, which reproduces it) rejects the word
    `pass` anywhere outside comments, and 27 of its task files say "forward pass" in a docstring."""
    import ast
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Expr(ast.Constant(Ellipsis))]
    return ast.unparse(tree) + "\n"


def copy_candidate(task_source: str, *, wrong: bool = False, backend: str = "cuda") -> str:
    """The candidate program for a task: its code (without docstrings), then a ModelNew whose outputs go through one
    copy kernel. Only WRONG differs between tasks and variants: the extension is the same build everywhere."""
    if backend == "cuda":
        source, sources = COPY_CUDA, "cpp_sources=" + repr(COPY_DECL) + ", cuda_sources=_copy_source"
    elif backend == "cpu":
        source, sources = COPY_CPU, "cpp_sources=_copy_source"
    else:
        raise ValueError(f"backend {backend!r}: expected 'cuda' or 'cpu'")
    if "ModelNew" in task_source or "_copy_ext" in task_source:
        raise ValueError("the task source already defines names the candidate adds")
    tail = CANDIDATE_TAIL.format(wrong=bool(wrong), source=source,
                                 name=EXTENSION_NAME + ("" if backend == "cuda" else "_cpu"), sources=sources)
    return without_docstrings(task_source) + tail


def response(program: str) -> str:
    """The program as a model's answer (the evaluator extracts the code block)."""
    return f"I keep the reference computation and copy its result with my own kernel.\n\n```python\n{program}```\n"


# --- sizes on PyTorch's meta device ------------------------------------------------------------------------------
def meta_sizes(source: str) -> dict:
    """{output_bytes, input_bytes} of a task, from running it on PyTorch's meta device (no memory, no compute), or
    {error} for tasks that need real values (`.item()`) or a module not installed here."""
    import types

    import torch
    module = types.ModuleType("kernelbench_task")
    try:
        with torch.device("meta"):
            exec(compile(source, "<task>", "exec"), module.__dict__)
            model = module.Model(*module.get_init_inputs())
            inputs = module.get_inputs()
            out = model(*inputs)
    except Exception as e:  # noqa: BLE001 - the size is then unknown; the GPU run says the rest
        return {"error": f"{type(e).__name__}: {e}"[:200]}

    def leaves(x):
        if isinstance(x, torch.Tensor):
            return [x]
        if isinstance(x, (tuple, list)):
            return [t for item in x for t in leaves(item)]
        return []
    return {"output_bytes": sum(t.numel() * t.element_size() for t in leaves(out)),
            "input_bytes": sum(t.numel() * t.element_size() for t in leaves(list(inputs)))}


# --- how long a job takes on one H100: an estimate from docs/LOG.md's numbers, not a measurement ---------------
REFERENCE_PATH_S = {1: 1.76, 2: 1.76, 3: 3.62}   # check_references over KernelBench on one H100 (2026-11-25 entry):
                                                  # 351 s for levels 1-2's 200 tasks, 181 s for level 3's 50
REFERENCE_MS_P50 = {1: 4.3, 2: 4.0, 3: 7.4}      # the same run's median reference times
CANDIDATE_FIXED_S = 1.5      # the candidate's import in its worker (0.94 s, same entry) plus trace, kernel trace, checks
HOST_COPY_BYTES_PER_S = 8e9  # a large output's trip through the pinned buffer (assumed; page faults and pinning incl.)


def estimate_s(level: int, kind: str, output_bytes: int, *, quick: bool, trials: int, reps: int) -> float:
    """Seconds of one GPU for a job, from the numbers above (the sweep's own measurements replace it)."""
    ref_ms = REFERENCE_MS_P50.get(level, 5.0)
    seconds = REFERENCE_PATH_S.get(level, 2.5) + CANDIDATE_FIXED_S
    n_trials = trials if quick else 5
    if kind == "wrong":          # one failing trial, the reference's time from the cache
        return seconds * 0.7 + 2 * output_bytes / HOST_COPY_BYTES_PER_S
    timed = (reps + 6) if quick else 103          # the candidate's timed calls (kernelbench: 3 + 100)
    seconds += timed * 2 * ref_ms / 1e3 + n_trials * 2 * ref_ms / 1e3
    transfers = n_trials + 2 + 2                  # trials, timed output, freshness; pinning both sides
    return seconds + transfers * output_bytes / HOST_COPY_BYTES_PER_S


# --- verdicts ---------------------------------------------------------------------------------------------------
CLASSES = ("ok", "incorrect", "internal_error", "too_big", "reference_error", "runtime_error", "crash",
           "compile_error", "rejected", "compiled", "format_error", "no_verdict")


def verdict_class(r, *, flags_count: bool) -> str:
    """One word for a verdict. `flags_count`: rejecting flags make a correct candidate "rejected" (the kernelbench
    profile, where only KernelBench's own rules reject); off in --quick (Kevin's profile flags the reference's ops
    that every honest copy candidate runs)."""
    from cuda_eval.api import INTERNAL_ERROR
    meta = r.meta or {}
    if meta.get("internal_error") or (r.runtime_error or "").startswith(INTERNAL_ERROR):
        return "internal_error"
    if meta.get("task_too_large") or meta.get("reference_oom"):
        return "too_big"
    if meta.get("reference_error"):
        return "reference_error"
    if not r.format_ok:
        return "format_error"
    if r.compiled is False:
        return "compile_error"
    if r.mode == "compile_only":
        return "compiled" if r.compiled else "rejected"
    if r.correct is None:
        return "rejected" if r.hack_flags else "no_verdict"
    if meta.get("crash"):
        return "crash"
    if r.correct is False:
        return "runtime_error" if r.runtime_error else "incorrect"
    return "rejected" if (flags_count and r.hack_flags) else "ok"


def expected_class(kind: str, mode: str) -> str:
    if mode == "compile_only":
        return "compiled"
    return "ok" if kind == "honest" else "incorrect"


# --- device memory, sampled --------------------------------------------------------------------------------------
class DeviceMemorySampler:
    """Each card's used memory (nvidia-smi, every `period_s`): what its judge, worker and spare workers hold together.
    peak(device, start, end) is the largest sample of a device (an evaluator slot: an index among the visible GPUs)
    in a wall-clock window (a job's)."""

    def __init__(self, period_s: float = 0.25):
        self.period_s = period_s
        self.samples: dict[str, list[tuple[float, int]]] = {}
        self.total_bytes: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="device-memory")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
                now = time.time()
                for line in out.stdout.strip().splitlines():
                    index, used, total = (x.strip() for x in line.split(","))
                    self.samples.setdefault(index, []).append((now, int(used) << 20))
                    self.total_bytes[index] = int(total) << 20
            except (OSError, subprocess.SubprocessError, ValueError):
                pass
            self._stop.wait(self.period_s)

    def peak(self, device: str, start: float, end: float) -> int | None:
        inside = [used for t, used in self.samples.get(physical_gpu(int(device)), []) if start <= t <= end]
        return max(inside) if inside else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def physical_gpu(index: int) -> str:
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if visible else str(index)


# --- the run ----------------------------------------------------------------------------------------------------
def select_tasks(args) -> list:
    from kevin_jax.tasks.kernelbench import load_kernelbench_dir
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    loaded = load_kernelbench_dir(args.root, levels)
    if loaded.skipped:
        print(f"skipped by the loader: {[s.path for s in loaded.skipped]}", flush=True)
    tasks = []
    for level in levels:
        of_level = [t for t in loaded.tasks if t.level == level]
        tasks += of_level[:args.limit] if args.limit else of_level
    if args.tasks:
        wanted = [w.strip() for w in args.tasks.split(",") if w.strip()]
        tasks = [t for t in tasks if any(w == t.task_id or w in t.task_id for w in wanted)]
    if not tasks:
        raise SystemExit(f"no tasks selected under {args.root} (levels {levels}, tasks {args.tasks!r})")
    return tasks


def wrong_tasks(tasks: list, n: int) -> set[str]:
    """`n` task ids for wrong candidates, spread evenly over each level in proportion to its size (at least one per
    level when n allows)."""
    if n <= 0:
        return set()
    by_level: dict[int, list] = {}
    for t in tasks:
        by_level.setdefault(t.level, []).append(t)
    chosen: set[str] = set()
    for level, of_level in sorted(by_level.items()):
        k = min(len(of_level), max(1, round(n * len(of_level) / len(tasks))))
        step = len(of_level) / k
        chosen |= {of_level[int(i * step)].task_id for i in range(k)}
    return chosen


def eval_config(args):
    from cuda_eval.api import EvalConfig
    cfg = dict(run_timeout_s=args.timeout_s, compile_workers=args.compile_workers,
               spare_workers=args.spares, mode=args.mode)
    if args.quick:
        cfg.update(profile="kevin", strict=True, skip_run_on_static_flags=False, num_correct_trials=args.trials,
                   timing_min_reps=args.reps, timing_max_reps=args.reps, timing_target_s=0.0, timing_warmup_s=0.0,
                   timing_input_sets=1)
    else:
        cfg.update(profile=args.profile)
    if args.device_type == "cpu":
        cfg.update(device_type="cpu", cpu_workers=1)
    elif args.mode != "compile_only":
        cfg.update(devices=args.devices)
    return EvalConfig(**cfg)


def row_of(job: dict, r, sampler: DeviceMemorySampler | None, quick: bool, mode: str) -> dict:
    meta = r.meta or {}
    run_s = r.stage_times.get("run")
    started = meta.get("run_started_at")
    device = str(meta.get("device", ""))
    device_peak = sampler.peak(device, started, started + run_s) if sampler and started and run_s and \
        device.isdigit() else None
    klass = verdict_class(r, flags_count=not quick)
    return {"task_id": job["task"].task_id, "level": job["task"].level, "kind": job["kind"],
            "verdict": klass, "expected": expected_class(job["kind"], mode),
            "correct": r.correct, "error": (r.runtime_error or r.format_error or
                                            (r.compile_log if r.compiled is False else "") or "")[:400],
            "flags": [f["code"] for f in r.hack_flags], "advisory": [f["code"] for f in r.advisory_flags],
            "task_too_large": meta.get("task_too_large"), "output_bytes": job["sizes"].get("output_bytes"),
            "device": meta.get("device"), "estimate_s": job.get("estimate_s"),
            "total_s": r.stage_times.get("total"), "run_s": run_s, "judge_s": meta.get("judge_s"),
            "compile_s": r.stage_times.get("compile"), "cache_hit": meta.get("cache_hit"),
            "judge_rss_bytes": meta.get("judge_peak_rss_bytes"), "worker_rss_bytes": meta.get("worker_peak_rss_bytes"),
            "shared_bytes": meta.get("output_buffer_bytes"), "judge_device_bytes": meta.get("judge_peak_device_bytes"),
            "device_used_bytes": device_peak, "ref_ms": (r.ref_timing or {}).get("median_ms"),
            "cand_ms": (r.timing or {}).get("median_ms"), "phase_s": meta.get("phase_s")}


def summarize(rows: list[dict], levels: list[int], info: dict, wall_s: float, not_run: list[str],
              title: str = "") -> str:
    gib = lambda n: f"{n / 2**30:.1f}" if n else "-"  # noqa: E731
    title = title or f"KernelBench sweep on {info.get('gpu_name') or 'no GPU'} ({len(rows)} verdicts, {wall_s:.0f} s)"
    lines = [f"## {title}", "", "| level | kind | jobs | as expected | ok | incorrect | internal error | too big | other | "
             "run s p50 / max | device GiB max |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for level in levels:
        for kind in ("honest", "wrong"):
            lr = [r for r in rows if r["level"] == level and r["kind"] == kind]
            if not lr:
                continue
            count = lambda *k: sum(r["verdict"] in k for r in lr)  # noqa: E731
            other = len(lr) - count("ok", "incorrect", "internal_error", "too_big")
            run = [r["run_s"] for r in lr if r.get("run_s")]
            dev = max((r.get("device_used_bytes") or r.get("judge_device_bytes") or 0 for r in lr), default=0)
            lines.append(f"| {level} | {kind} | {len(lr)} | {sum(r['verdict'] == r['expected'] for r in lr)} | "
                         f"{count('ok')} | {count('incorrect')} | {count('internal_error')} | {count('too_big')} | "
                         f"{other} | {statistics.median(run) if run else 0:.1f} / {max(run, default=0):.1f} | "
                         f"{gib(dev)} |")
    odd = [r for r in rows if r["verdict"] != r["expected"]]
    if odd:
        lines += ["", "| task | kind | verdict | expected | error |", "|---|---|---|---|---|"]
        lines += [f"| {r['task_id']} | {r['kind']} | {r['verdict']} | {r['expected']} | "
                  f"{r['error'][:200].replace('|', '/').replace(chr(10), ' ')} |" for r in odd]
    big = sorted((r for r in rows if r.get("output_bytes")), key=lambda r: -r["output_bytes"])[:12]
    if big:
        lines += ["", "| largest outputs | kind | verdict | output GiB | shared GiB | judge RSS GiB | worker RSS GiB | "
                  "judge device GiB | card used GiB | run s |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['task_id']} | {r['kind']} | {r['verdict']} | {gib(r['output_bytes'])} | "
                  f"{gib(r.get('shared_bytes'))} | {gib(r.get('judge_rss_bytes'))} | {gib(r.get('worker_rss_bytes'))} | "
                  f"{gib(r.get('judge_device_bytes'))} | {gib(r.get('device_used_bytes'))} | "
                  f"{r.get('run_s') or 0:.1f} |" for r in big]
    if not_run:
        lines += ["", f"not run (budget): {len(not_run)} jobs, e.g. {', '.join(not_run[:8])}"]
    return "\n".join(lines)


def report(paths: list[str]) -> str:
    """The tables of rows saved by earlier runs (their <out>.jsonl), merged by (task, kind)."""
    rows: dict = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[(row["task_id"], row["kind"])] = row
    merged = list(rows.values())
    tasks = {r["task_id"] for r in merged}
    cards = collections.Counter(r.get("gpu_name") or "card not recorded" for r in merged)
    title = f"KernelBench sweep, saved rows: {len(merged)} verdicts of {len(tasks)} tasks from {len(paths)} file(s)"
    title += " (" + ", ".join(f"{n} on {card}" for card, n in cards.most_common()) + ")"
    return summarize(merged, sorted({r["level"] for r in merged}), {}, 0.0, [], title=title)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default="", help="KernelBench checkout or folder of level<N>/ dirs (required to run)")
    p.add_argument("--report", default="",
                   help="run nothing: print the tables of saved rows (<out>.jsonl files, comma-separated, e.g. one "
                        "per GPU of a split run; a task and kind seen twice count once: the row of the file named "
                        "last, so name a rerun after the run it replaces)")
    p.add_argument("--levels", default="1,2,3")
    p.add_argument("--limit", type=int, default=0, help="only the first N tasks of each level")
    p.add_argument("--tasks", default="", help="comma-separated task ids or parts of them (L1/19_ReLU, 19_ReLU)")
    p.add_argument("--max-bytes", type=float, default=0,
                   help="only tasks whose inputs + outputs (meta device) are at most this many bytes (CPU runs)")
    p.add_argument("--wrong", type=int, default=60, help="tasks that also get a wrong candidate, spread over levels")
    p.add_argument("--only", choices=("all", "honest", "wrong"), default="all")
    p.add_argument("--order", choices=("listed", "largest-first"), default="listed",
                   help="largest-first: the tasks with the largest outputs (meta device) first")
    p.add_argument("--profile", default="kernelbench")
    p.add_argument("--quick", action="store_true",
                   help="Kevin's profile, static reject off, --trials trials, --reps timing repetitions")
    p.add_argument("--trials", type=int, default=2, help="correctness trials with --quick")
    p.add_argument("--reps", type=int, default=10, help="timing repetitions with --quick")
    p.add_argument("--mode", choices=("full", "compile_only"), default="full")
    p.add_argument("--devices", default="0", help="GPU indices (\"all\", \"0,1,2,3\"): one judge each")
    p.add_argument("--device-type", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per GPU job (EvalConfig.run_timeout_s)")
    p.add_argument("--compile-workers", type=int, default=0, help="0 = one per core")
    p.add_argument("--spares", type=int, default=4, help="pre-started workers (each holds a CUDA context)")
    p.add_argument("--window", type=int, default=0, help="requests in flight at once (0: 4 per GPU + 2)")
    p.add_argument("--budget-s", type=float, default=0.0, help="submit nothing new after this many seconds")
    p.add_argument("--resume", action="store_true", help="skip the (task, kind) pairs already in <out>.jsonl")
    p.add_argument("--dry-run", action="store_true", help="list the jobs and their sizes, run nothing")
    p.add_argument("--out", default="", help="summary JSON; rows go to <out>.jsonl as they arrive")
    args = p.parse_args(argv)
    if args.report:
        print(report(args.report.split(",")))
        return
    if not args.root:
        p.error("--root is required (unless --report)")
    if not args.dry_run and not args.out:
        p.error("--out is required unless --dry-run")

    tasks = select_tasks(args)
    sizes = {t.task_id: meta_sizes(t.source) for t in tasks}
    if args.max_bytes:
        tasks = [t for t in tasks if "error" not in sizes[t.task_id]
                 and sizes[t.task_id]["output_bytes"] + sizes[t.task_id]["input_bytes"] <= args.max_bytes]
    wrong = wrong_tasks(tasks, args.wrong)
    jobs = [{"task": t, "kind": kind, "sizes": sizes[t.task_id]} for t in tasks
            for kind in ("honest", "wrong") if (kind == "honest" or t.task_id in wrong)
            and args.only in ("all", kind)]
    for j in jobs:
        j["estimate_s"] = round(estimate_s(j["task"].level, j["kind"], j["sizes"].get("output_bytes") or 0,
                                           quick=args.quick, trials=args.trials, reps=args.reps), 2)
    if args.order == "largest-first":
        jobs.sort(key=lambda j: -(j["sizes"].get("output_bytes") or 0))
    jsonl = Path(args.out + "l") if args.out.endswith(".json") else Path(args.out + ".jsonl")
    done = set()
    if args.resume and jsonl.exists():
        for line in jsonl.read_text().splitlines():
            row = json.loads(line)
            done.add((row["task_id"], row["kind"]))
        jobs = [j for j in jobs if (j["task"].task_id, j["kind"]) not in done]
    levels = sorted({t.level for t in tasks})
    big = [t for t in tasks if (sizes[t.task_id].get("output_bytes") or 0) * 2 + (1 << 16) > 4 << 30]
    n_gpus = len([d for d in args.devices.split(",") if d.strip()]) if args.devices != "all" else 0
    gpu_s = sum(j["estimate_s"] for j in jobs)
    print(f"{len(tasks)} tasks (levels {levels}), {len(jobs)} jobs to run ({len(done)} done before), wrong "
          f"candidates for {len(wrong)}; {len(big)} tasks over the old 4 GiB output channel; sizes unknown for "
          f"{sum('error' in s for s in sizes.values())}; estimated {gpu_s:.0f} s of one H100 "
          f"(~{gpu_s / max(1, n_gpus):.0f} s on {n_gpus or 'all the'} GPU(s), plus ~60 s of start-up; "
          "an estimate from the LOG's reference sweep, not a measurement)", flush=True)
    if args.dry_run:
        for j in jobs:
            s = j["sizes"]
            print(f"{j['task'].task_id:60s} {j['kind']:6s} output "
                  f"{(s.get('output_bytes') or 0) / 2**30:7.3f} GiB  ~{j['estimate_s']:5.1f} s  "
                  f"{s.get('error', '')[:60]}")
        return

    from cuda_eval.api import EvalRequest, Evaluator
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    config = eval_config(args)
    backend = "cpu" if args.device_type == "cpu" else "cuda"
    t0 = time.monotonic()
    rows, not_run = [], []
    sampler = None
    with Evaluator(config) as ev, open(jsonl, "a" if args.resume else "w") as sink:
        info = (ev.gpu_pool.device_info() or {}) if ev.gpu_pool is not None else {}
        if args.device_type == "cuda" and args.mode == "full":
            sampler = DeviceMemorySampler()
        n_slots = len(getattr(getattr(ev.gpu_pool, "config", None), "devices", ()) or (1,))
        window = args.window or 4 * n_slots + 2

        def request(job: dict) -> EvalRequest:
            program = copy_candidate(job["task"].source, wrong=job["kind"] == "wrong", backend=backend)
            return EvalRequest(task_id=job["task"].task_id, task_source=job["task"].source,
                               response=response(program), request_id=f"{job['task'].task_id}/{job['kind']}")

        def record(job: dict, future) -> None:
            try:
                row = row_of(job, future.result(), sampler, args.quick, args.mode)
            except Exception as e:  # noqa: BLE001 - a lost future is an internal error of ours, recorded as such
                row = {"task_id": job["task"].task_id, "level": job["task"].level, "kind": job["kind"],
                       "verdict": "internal_error", "expected": expected_class(job["kind"], args.mode),
                       "error": f"{type(e).__name__}: {e}"[:400]}
            row["gpu_name"] = info.get("gpu_name")          # a split sweep's rows may come from different cards
            rows.append(row)
            sink.write(json.dumps(row, default=str) + "\n")
            sink.flush()
            mark = "" if row["verdict"] == row["expected"] else "   <-- expected " + row["expected"]
            print(f"[{time.monotonic() - t0:6.0f} s] {row['task_id']} {row['kind']}: {row['verdict']} "
                  f"(run {row.get('run_s') or 0:.1f} s){mark} {row['error'][:120] if mark else ''}", flush=True)

        pending: dict = {}
        queue = list(jobs)
        if queue:  # the first alone: its build fills the cache that every other candidate hits
            first = queue.pop(0)
            record(first, ev.submit([request(first)])[0])
        while queue or pending:
            while queue and len(pending) < window:
                if args.budget_s and time.monotonic() - t0 > args.budget_s:
                    not_run += [f"{j['task'].task_id}/{j['kind']}" for j in queue]
                    queue = []
                    break
                job = queue.pop(0)
                pending[ev.submit([request(job)])[0]] = job
            if not pending:
                break
            import concurrent.futures
            finished, _ = concurrent.futures.wait(list(pending), return_when=concurrent.futures.FIRST_COMPLETED)
            for f in finished:
                record(pending.pop(f), f)
    if sampler is not None:
        sampler.close()
    wall_s = time.monotonic() - t0
    all_rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if args.resume else rows
    text = summarize(all_rows, levels, info, wall_s, not_run)
    Path(args.out).write_text(json.dumps({"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                          "device": info, "wall_s": wall_s, "rows": all_rows,
                                          "not_run": not_run, "card_bytes": sampler.total_bytes if sampler else None},
                                         indent=1, default=str))
    print("\n" + text)


if __name__ == "__main__":
    main()
