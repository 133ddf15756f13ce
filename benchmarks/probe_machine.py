"""Records the facts of a GPU machine that the rest of kevin-jax is designed around, in one short run.

    python benchmarks/probe_machine.py --out $OUT/probe.json

Prints: GPU/driver/toolchain versions, whether a sandbox uid can read this checkout and the interpreter, the
compile-time baselines of KernelBench's one-shot add kernel (torch load_inline cold/warm, plain nvcc with and without
torch headers, per-phase nvcc times), copy bandwidth and a bf16 matmul rate (torch), and JAX/cuDNN/Pallas availability.
Each section is independent: a failure is recorded and the next section runs.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback

RESULTS: dict = {}

ADD_CUDA = textwrap.dedent(r"""
    #include <torch/extension.h>
    __global__ void add_kernel(const float* a, const float* b, float* out, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = a[i] + b[i];
    }
    torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
        auto out = torch::zeros_like(a);
        int n = a.numel();
        add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
        return out;
    }
""")
ADD_CPP = "torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b);"
KERNEL_ONLY = textwrap.dedent(r"""
    __global__ void add_kernel(const float* a, const float* b, float* out, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = a[i] + b[i];
    }
    void launch(const float* a, const float* b, float* o, int n) { add_kernel<<<(n + 255) / 256, 256>>>(a, b, o, n); }
""")


def section(name):
    def deco(fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                RESULTS[name] = fn(*a, **k)
            except Exception as e:  # a probe records failures and moves on
                RESULTS[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            print(f"[probe] {name}: {time.perf_counter() - t0:.1f}s", flush=True)
        return run
    return deco


def sh(cmd, timeout=600):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    return (p.stdout + p.stderr).strip()


@section("system")
def system():
    return {
        "uname": platform.uname()._asdict(), "python": sys.version, "executable": sys.executable,
        "nproc": os.cpu_count(), "uid": os.getuid(), "cwd": os.getcwd(),
        "nvidia_smi": sh("nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv"),
        "nvcc": sh("nvcc --version | tail -2"), "gcc": sh("gcc --version | head -1"),
        "mem": sh("free -g | head -2"), "cwd_perms": sh(f"namei -m {os.getcwd()}"),
        "exe_perms": sh(f"namei -m {os.path.realpath(sys.executable)}"),
        "pip": sh(f"{sys.executable} -m pip list 2>/dev/null | grep -iE "
                  "'^(jax|jaxlib|jax-cuda|flax|optax|orbax|torch|transformers|tokenizers|safetensors|numpy|"
                  "tensorboard|chex|pytest|pybind11|rich|tqdm|matplotlib|psutil|hypothesis|absl|ml.coll|pyarrow|"
                  "setuptools|triton|nvidia-cudnn|nvidia-cuda-runtime|scipy)'"),
        "cgroup": sh("cat /proc/self/cgroup; ls /sys/fs/cgroup | head -30"),
        "dev_nvidia": sh("ls -la /dev/nvidia*"),
    }


@section("sandbox_uid")
def sandbox_uid():
    """Can an unprivileged uid (60000) run our interpreter and import this checkout? Decides the sandbox design."""
    code = "import sys; sys.path.insert(0, %r); import os; print(os.getuid()); import torch; print(torch.__version__)" % os.getcwd()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(60000); os.setuid(60000)
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            os.write(1, f"[uid-child] rc={r.returncode} out={r.stdout.strip()} err={r.stderr.strip()[-500:]}\n".encode())
        except Exception as e:
            os.write(1, f"[uid-child] failed {e}\n".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return {"note": "see stdout line [uid-child]"}


def _timed(cmd, cwd, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, env=env)
    return time.perf_counter() - t0, p.returncode, (p.stderr or "")[-1500:]


@section("compile_baselines")
def compile_baselines():
    import torch
    from torch.utils import cpp_extension
    out = {}
    work = tempfile.mkdtemp(prefix="probe_compile_")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(work, "ext"))
    script = textwrap.dedent(f"""
        import time, torch
        from torch.utils.cpp_extension import load_inline
        t0 = time.perf_counter()
        m = load_inline(name="probe_add", cpp_sources={ADD_CPP!r}, cuda_sources={ADD_CUDA!r},
                        functions=["elementwise_add_cuda"], verbose=False)
        t1 = time.perf_counter()
        a = torch.randn(1 << 20, device="cuda"); b = torch.randn(1 << 20, device="cuda")
        assert torch.allclose(m.elementwise_add_cuda(a, b), a + b)
        print("LOAD_INLINE_S", t1 - t0)
    """)
    open(os.path.join(work, "li.py"), "w").write(script)
    for label in ("load_inline_cold", "load_inline_warm"):
        t, rc, err = _timed(f"{sys.executable} li.py", work, env)
        out[label] = {"wall_s_process": round(t, 2), "rc": rc, "err": err if rc else ""}
    inc = cpp_extension.include_paths(device_type="cuda") if "device_type" in cpp_extension.include_paths.__code__.co_varnames else cpp_extension.include_paths(cuda=True)
    import sysconfig
    incs = " ".join(f"-I{p}" for p in inc + [sysconfig.get_paths()["include"]])
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    base = f"nvcc {incs} -D_GLIBCXX_USE_CXX11_ABI={abi} -DTORCH_EXTENSION_NAME=x -DTORCH_API_INCLUDE_EXTENSION_H -std=c++17 -Xcompiler -fPIC -arch=sm_90"
    open(os.path.join(work, "ext.cu"), "w").write("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + ADD_CUDA)
    open(os.path.join(work, "types.cu"), "w").write("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + ADD_CUDA.replace("#include <torch/extension.h>", ""))
    open(os.path.join(work, "kernel.cu"), "w").write(KERNEL_ONLY)
    for label, src in (("nvcc_torch_extension_h", "ext.cu"), ("nvcc_torch_types_h", "types.cu"), ("nvcc_kernel_only", "kernel.cu")):
        csv = os.path.join(work, label + ".csv")
        t, rc, err = _timed(f"{base} -c {src} -o {label}.o -time {csv}", work)
        phases = {}
        if os.path.exists(csv):
            for line in open(csv).read().splitlines()[1:]:
                cols = [c.strip() for c in line.split(",")]
                if len(cols) > 3:
                    phases[cols[1]] = round(float(cols[-2]) / 1000, 2)
        out[label] = {"wall_s": round(t, 2), "rc": rc, "phases_s": phases, "err": err if rc else ""}
    open(os.path.join(work, "main.cpp"), "w").write("#include <torch/extension.h>\n" + ADD_CPP + "\nPYBIND11_MODULE(x, m) { m.def(\"elementwise_add_cuda\", torch::wrap_pybind_function(elementwise_add_cuda)); }\n")
    gxx = base.replace("nvcc", "g++").replace("-Xcompiler -fPIC -arch=sm_90", "-fPIC")
    for opt in ("-O0", "-O2"):
        t, rc, err = _timed(f"{gxx} {opt} -c main.cpp -o main{opt}.o", work)
        out[f"gxx_main_cpp{opt}"] = {"wall_s": round(t, 2), "rc": rc, "err": err if rc else ""}
    os.makedirs(os.path.join(work, "pch"), exist_ok=True)
    open(os.path.join(work, "pch", "ext.h"), "w").write("#include <torch/extension.h>\n")
    t, rc, err = _timed(f"{gxx} -O0 -x c++-header pch/ext.h -o pch/ext.h.gch", work)
    out["gxx_build_pch"] = {"wall_s": round(t, 2), "rc": rc, "err": err if rc else ""}
    t, rc, err = _timed(f"{gxx} -O0 -include pch/ext.h -Winvalid-pch -c main.cpp -o main_pch.o", work)
    out["gxx_main_cpp_with_pch"] = {"wall_s": round(t, 2), "rc": rc, "err": err if rc else ""}
    shutil.rmtree(work, ignore_errors=True)
    return out


@section("torch_gpu")
def torch_gpu():
    import torch
    p = torch.cuda.get_device_properties(0)
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "name": p.name, "sms": p.multi_processor_count,
           "l2_bytes": getattr(p, "L2_cache_size", None), "mem_gb": p.total_memory / 2**30,
           "cudnn": torch.backends.cudnn.version()}
    from bandwidth import torch_copy   # benchmarks/ is the script's directory
    out["copy_TBps_rw"] = round(torch_copy(gib=2.0, repeats=10)["tb_s"], 2)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(); s.record()
    for _ in range(10):
        a @ b
    e.record(); torch.cuda.synchronize()
    out["bf16_matmul_TFLOPs"] = round(2 * 8192**3 * 10 / (s.elapsed_time(e) / 1e3) / 1e12, 1)
    return out


@section("jax")
def jax_probe():
    code = textwrap.dedent("""
        import json, time, jax, jax.numpy as jnp
        out = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()]}
        try:
            q = jnp.ones((2, 4096, 12, 128), jnp.bfloat16); k = jnp.ones((2, 4096, 2, 128), jnp.bfloat16)
            f = jax.jit(lambda q, k: jax.nn.dot_product_attention(q, k, k, is_causal=True, implementation="cudnn"))
            f(q, k).block_until_ready(); out["cudnn_attention_gqa"] = "ok"
        except Exception as e:
            out["cudnn_attention_gqa"] = repr(e)[:500]
        for mod in ("jax.experimental.pallas.ops.gpu.decode_attention", "jax.experimental.pallas.ops.gpu.paged_attention",
                    "jax.experimental.pallas.ops.gpu.attention", "jax.experimental.pallas.mosaic_gpu"):
            try:
                __import__(mod); out[mod] = "importable"
            except Exception as e:
                out[mod] = repr(e)[:200]
        a = jnp.ones((8192, 8192), jnp.bfloat16)
        mm = jax.jit(lambda a: a @ a)
        mm(a).block_until_ready(); t = time.perf_counter()
        for _ in range(10): r = mm(a)
        r.block_until_ready(); out["bf16_matmul_TFLOPs_ones"] = round(2 * 8192**3 * 10 / (time.perf_counter() - t) / 1e12, 1)
        print("JAXJSON" + json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    for line in r.stdout.splitlines():
        if line.startswith("JAXJSON"):
            return json.loads(line[7:])
    return {"error": r.stderr[-3000:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe.json")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    for name, fn in (("system", system), ("sandbox_uid", sandbox_uid), ("torch_gpu", torch_gpu), ("jax", jax_probe),
                     ("compile_baselines", compile_baselines)):
        if name not in skip:
            fn()
    with open(args.out, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    print(json.dumps(RESULTS, indent=1, default=str)[-9000:])


if __name__ == "__main__":
    main()
