"""Static reward-hack policy: reads the candidate's source with `ast` (never executes it) and returns hack flags.

Kevin's rules are the default (`StaticPolicy()`): a response scores 0 unless it defines a CUDA kernel (`__global__`)
and builds it with `load_inline`; ModelNew.forward (and every helper it reaches) must not compute with torch
(torch.nn modules / torch.nn.functional / torch compute functions and tensor methods, `@`), beyond allocation, views,
dtype/device moves, Parameters and containers; no try/except fallbacks; no use of the reference `Model`. We add what
KernelBench's users found: assignments that monkeypatch torch/time/builtins, threads (Python or C++), and native
escapes (C++ that reaches the loader, threads, processes, raw syscalls or the Python interpreter: dlsym/dlopen,
pthread_create, clone, fork, exec*, system/popen, syscall, py::exec, PyRun_*, PyImport_*; Python that forks, execs or
loads C through ctypes/cffi); kernels registered for ATen's own ops (monkeypatch); ATen's library ops called below
the dispatcher (at::cpu::mm: library_heavy_op, as the op tracer flags their dispatched forms).

The dynamic checks in worker/ catch what static analysis cannot (ops reached through helpers we cannot resolve,
C++ wrappers calling ATen, kernels never launched); these static flags are cheap and let the evaluator skip the GPU.

Also exported: `cuda_kernel_names(sources)`, the `__global__` function names of CUDA sources (the reserved-name rule
reads them; which kernels are the candidate's comes from its built binary: protocol/kernel_symbols.py).
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Iterable

from cuda_eval.static import pysource


@dataclasses.dataclass(frozen=True)
class HackFlag:
    """One reason to reject a candidate. `code` is stable (tests, metrics); `reason` is for humans and the model."""
    code: str
    reason: str

    def to_dict(self) -> dict:
        return {"code": self.code, "reason": self.reason}


# Every flag code the evaluator can emit (static and dynamic), with the one-line meaning used in docs and feedback.
FLAG_CODES: dict[str, str] = {
    # static (this module)
    "no_cuda_kernel": "the program defines no CUDA kernel (__global__ function)",
    "no_load_inline": "the program does not build its kernel with torch.utils.cpp_extension.load_inline",
    "torch_in_forward": "ModelNew.forward computes with PyTorch (torch.nn, torch.nn.functional, torch ops)",
    "try_except": "try/except fallback",
    "reference_model": "uses or subclasses the reference Model",
    "monkeypatch": "replaces torch/time/builtin functions",
    "thread": "starts threads (Python threading or C++ threads)",
    "pass_statement": "a `pass` statement (KernelBench's inheritance-bypass rule; the kernelbench profile only)",
    "native_escape": "reaches the dynamic loader, threads, processes, raw syscalls or the Python interpreter "
                     "natively (dlsym/dlopen, pthread_create, clone, fork/exec, system/popen, syscall, ctypes, "
                     "py::exec, PyRun_*, PyImport_*), around the other checks",
    "harness_access": "reaches the evaluator's own code (cuda_eval), the interpreter's frames or profile hooks, or "
                      "torch's dispatch, profiler or private timing switches (statically, through aliases, getattr "
                      "and sys.modules too; or, in the worker, switches the op tracer off during a call)",
    # dynamic (worker/)
    "no_custom_kernel": "forward never ran the candidate's own kernel",
    "torch_compute_in_forward": "forward ran PyTorch compute ops from Python",
    "reference_op": "forward ran the reference's own PyTorch compute ops (in Python or in the C++ wrapper)",
    "library_heavy_op": "forward ran a PyTorch library GEMM/convolution/attention op",
    "host_transfer": "forward copied data between the GPU and the host",
    "input_mutated": "forward modified its inputs",
    "output_aliases_input": "an output shares memory with an input",
    "output_aliases_parameter": "an output shares memory with a parameter or buffer",
    "output_not_plain_tensor": "an output is a tensor subclass or a lazily evaluated wrapper",
    "cached_output": "outputs do not follow fresh inputs (results cached across calls)",
    "stale_output": "output equals an earlier reference result (reused buffer)",
    "unsynced_stream": "work on another stream was not ordered with the current stream",
    "background_thread": "threads left running after forward",
    "calls_reference_model": "forward executed the reference Model's code",
    "speedup_not_reproduced": "the speedup did not hold when re-timed in a fresh process",
    # judge (judge/job.py)
    "timing_inconsistent": "the judge's clock, or the kernel trace of the calls, shows far more time than the "
                           "candidate reported (or less than an empty call takes)",
    "faster_than_hardware": "a call was reported faster than the card can move the bytes it must read and write",
    "timed_output_mismatch": "the output of a timed call, picked by the judge after the call, was wrong (the timed "
                             "calls did not compute it)",
    "uncommitted_output": "the output sent for a call differs from the digest committed when the call ran (computed "
                          "or changed afterwards)",
}

# torch.<name>(...) calls that allocate, describe or move data rather than compute on it.
_TORCH_ALLOWED_CALLS = frozenset("""
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like tensor as_tensor as_strided
    from_numpy arange Size device dtype is_tensor is_floating_point is_complex numel get_default_dtype no_grad
    inference_mode enable_grad broadcast_shapes promote_types result_type finfo iinfo manual_seed
    get_device set_grad_enabled is_grad_enabled initial_seed
""".split())
# torch functions that only allocate, view, move or describe (at run time too: torch._C builtins).
_TORCH_NOT_COMPUTE = frozenset("""
    empty_like empty_strided zeros ones full clone contiguous detach view reshape squeeze unsqueeze flatten
    permute transpose t narrow select split chunk unbind as_strided expand get_device is_nonzero is_same_size
    is_inference_mode_enabled is_autocast_enabled is_anomaly_enabled set_default_dtype get_num_threads
""".split())
# torch.<submodule>.* namespaces whose members are not compute (streams, events, devices, extension loading...).
_TORCH_ALLOWED_NAMESPACES = ("torch.cuda", "torch.utils", "torch.backends", "torch.version", "torch.jit",
                             "torch.compiler", "torch.library")
# ATen ops of a library GEMM, convolution, attention, RNN or norm (library_heavy_op: the op tracer, protocol/tracing.py,
# and the static rule for ATen called below the dispatcher).
LIBRARY_HEAVY_OPS = frozenset("""
    mm addmm bmm baddbmm addbmm matmul linear _addmm_activation addmv mv dot vdot einsum _int_mm _scaled_mm
    convolution _convolution cudnn_convolution cudnn_convolution_transpose convolution_overrideable conv1d conv2d
    conv3d conv_transpose1d conv_transpose2d conv_transpose3d mkldnn_convolution miopen_convolution
    slow_conv2d_forward slow_conv3d_forward slow_conv_transpose2d slow_conv_transpose3d slow_conv_dilated2d
    slow_conv_dilated3d _slow_conv2d_forward thnn_conv2d _nnpack_spatial_convolution
    _scaled_dot_product_attention_math scaled_dot_product_attention _scaled_dot_product_flash_attention
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention _flash_attention_forward
    _efficient_attention_forward _cudnn_rnn lstm gru rnn_tanh rnn_relu _thnn_fused_lstm_cell cudnn_batch_norm
    native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training native_layer_norm
    native_group_norm _fused_rms_norm
""".split())
# Tensor methods that compute (flagged when called in forward); views, allocation and moves are not listed.
_TENSOR_COMPUTE_METHODS = frozenset("""
    matmul mm bmm addmm addmv addbmm baddbmm mv dot vdot outer inner einsum tensordot kron
    sum nansum mean nanmean prod cumsum cumprod cummax cummin logcumsumexp logsumexp std var var_mean std_mean
    norm renorm max min amax amin aminmax argmax argmin median nanmedian mode quantile sort argsort topk kthvalue
    msort unique all any count_nonzero
    relu relu_ sigmoid sigmoid_ tanh tanh_ softmax log_softmax exp exp_ exp2 expm1 log log_ log2 log10 log1p
    sqrt sqrt_ rsqrt rsqrt_ pow pow_ square abs abs_ neg neg_ reciprocal sign sgn clamp clamp_ clip clip_
    clamp_min clamp_max floor ceil round trunc frac erf erfc erfinv sin cos tan asin acos atan atan2 sinh cosh
    hardtanh gelu silu mish elu selu leaky_relu softplus hardsigmoid hardswish logit
    add add_ sub sub_ mul mul_ div div_ true_divide floor_divide remainder fmod addcmul addcmul_ addcdiv addcdiv_
    lerp lerp_ maximum minimum fmax fmin hypot xlogy
    masked_fill masked_fill_ masked_scatter masked_select where gather scatter scatter_ scatter_add scatter_add_
    scatter_reduce index_select index_add index_add_ index_copy index_fill index_put index_put_ take put_
    tril triu diag diag_embed trace cross cdist histc bincount
    eq ne gt lt ge le logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor isnan
    isinf isfinite nan_to_num nan_to_num_ roll flip rot90 repeat repeat_interleave tile cumulative_trapezoid
    conv1d conv2d conv3d dropout dropout_ normal_ uniform_ bernoulli bernoulli_ exponential_ random_
""".split())
# nn.Module classes that are containers or plain data, not compute (calling them in forward is not flagged).
_NN_CONTAINERS = frozenset({"Module", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "Parameter",
                            "Identity", "Buffer"})
# Modules whose attributes a candidate must not reassign (timers, synchronisation, comparison functions...).
_PROTECTED_MODULES = ("torch", "time", "builtins", "sys", "threading", "os", "gc", "numpy", "cuda_eval", "ctypes",
                      "timeit", "importlib")
_THREAD_MODULES = ("threading", "_thread", "multiprocessing", "concurrent", "asyncio")
# C++ that starts threads: std/C11/POSIX threads, timers that call back on a thread of their own (timer_create's
# SIGEV_THREAD), ATen's and c10's pools (at::launch runs on the inter-op pool). A thread that does the work and exits
# within the call would leave the op tracer and the thread count nothing to see.
_CPP_THREAD_PATTERN = re.compile(
    r"std::thread\b|std::jthread\b|pthread_create\b|std::async\b|#\s*include\s*<(?:thread|threads\.h)>|"
    r"\bthrd_create\b|\btimer_create\b|\bSIGEV_THREAD\b|\bboost::thread\b|"
    r"\b(?:at|c10|caffe2)\s*::\s*(?:launch|intraop_launch\w*|\w*ThreadPool\w*|get_\w*pool\w*)\b")
# Native escapes in C++/CUDA sources. Distinctive names count wherever they appear, comments included (a function
# pointer taken with `auto f = dlsym;` calls it just as well, and asm("syscall") is a string); common words only as a
# call or an address (`fork(`, `&system`) outside comments. Member and qualified calls (`x.clone()`, `at::clone(`)
# are not these functions; `std::` and global `::` ones are.
_NATIVE_QUALIFIED = r"(?<![\w.:>])(?:(?:std)?\s*::\s*)?\b"
_NATIVE_RARE_PATTERN = re.compile(
    _NATIVE_QUALIFIED + r"(dlsym|dlvsym|dlopen|dlmopen|pthread_create|clone3|__clone|vfork|execve|execveat|fexecve|"
    r"execvpe|posix_spawnp?|syscall|sysenter)\b"
    r"|#\s*include\s*<(dlfcn\.h|spawn\.h|sys/syscall\.h)>"
    r"|\bint\s+\$?0x80\b")
_NATIVE_COMMON = "clone|fork|system|popen|execv|execvp|execl|execlp|execle"
_NATIVE_COMMON_PATTERN = re.compile(
    _NATIVE_QUALIFIED + r"(" + _NATIVE_COMMON + r")\s*\(|&\s*(?:(?:std)?\s*::\s*)?\b(" + _NATIVE_COMMON + r")\b")
# Python reached from native code: CPython's C API (PyRun_*, PyImport_*, PyEval_*, PyObject_SetAttr...,
# Py_CompileString), torch's Python bindings (THP*, the PyInterpreter), and pybind11's interpreter, module and object
# API (py::exec, py::eval, py::module_::import, py::object, .attr(...)). The ast rules and the op tracer see only the
# program's Python: Python run from C++ (an import of one of our modules and an attribute set on it) is unseen by
# both. Honest kernels take and return tensors, never Python objects. Distinctive names count anywhere, comments
# included; pybind11's short names outside comments and literals.
_CPP_PYTHON_PATTERN = re.compile(
    r"\b_?Py[A-Z][A-Za-z]*_[A-Za-z]\w*|\bPy_[A-Z][a-z]\w*|\bTHP[A-Z]\w*|\bPyInterpreter\b|\bSafePyObject\b|"
    r"pybind11/(?:embed|eval)\.h")
_CPP_PYBIND_PATTERN = re.compile(
    r"\b(?:py|pybind11)\s*::\s*(?:exec\w*|eval\w*|globals|module_?|import\w*|dict|object|handle|function|"
    r"cpp_function|reinterpret_\w+|getattr|setattr|hasattr|delattr|cast|capsule|type|builtins|\w*interpreter\w*|"
    r"detail|str|bytes|list|tuple|iterable|iterator|sequence|none|weakref|print)\b|"
    r"\.\s*attr\s*\(|\busing\s+namespace\s+pybind11\b|\bnamespace\s+(?!py\s*=)\w+\s*=\s*pybind11\b")
# Kernels registered for ATen's own ops (or a fallback for every op): they replace what torch calls, the harness's
# own calls included. A library of the program's own namespace (TORCH_LIBRARY(myops, m)) is its own.
_CPP_ATEN_REGISTRATION = re.compile(
    r"\bTORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\(\s*(?:aten|_)\s*,|\bc10\s*::\s*Dispatcher\b|\bRegisterOperators\b|"
    r"\bregister(?:Fallback|Impl|Kernel)\b|\btorch\s*::\s*Library\b|\bTorchLibraryInit\b|"
    r"\.\s*(?:impl|def|fallback)\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\(\s*)?\"aten::")
# ATen below the dispatcher: at::cpu::mm, at::cuda::addmm, at::native::convolution, at::_ops::mm::redispatch call
# the kernel itself, unseen by the op tracer; a library GEMM/convolution/attention op reached that way is
# library_heavy_op as its dispatched form is. cuBLAS through ATen's own wrappers (at::cuda::blas::) too.
_CPP_UNDISPATCHED = re.compile(
    r"\bat\s*::\s*(cpu|cuda|native|_ops|meta|composite\w*)\s*::\s*(?:blas\s*::\s*)?(\w+)")
_CPP_ATEN_BLAS = re.compile(r"\bat\s*::\s*cuda\s*::\s*blas\s*::\s*\w+")
# C/C++ comments and string/character literals (matched together, so that "//" inside a string is no comment): for
# the common words, neither holds a call.
_CPP_COMMENT_OR_LITERAL = re.compile(r'("(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')|//[^\n]*|/\*.*?\*/', re.S)
# Python modules that load C or start processes, and os functions that fork or exec.
_NATIVE_PY_MODULES = ("ctypes", "_ctypes", "cffi", "subprocess", "_posixsubprocess", "pty")
_NATIVE_PY_CALLS = re.compile(r"^(os|posix)\.(fork|forkpty|vfork|system|popen|exec\w*|spawn\w*|posix_spawn\w*)$")
# Harness access: what a candidate never needs and a forger does. Our own modules; torch's switches of the op tracer,
# the profiler (the kernel trace) and the spin kernel our gates use; the interpreter's frames and profile hooks (how
# a call would tell a timed call from a checked one).
_HARNESS_MODULES = ("cuda_eval",)
_TORCH_SWITCH_MODULES = ("torch.utils._python_dispatch", "torch._dispatch", "torch._ops", "torch.profiler",
                         "torch.autograd.profiler", "torch.autograd.profiler_util", "torch.autograd.graph",
                         "torch._C._autograd", "torch._C._profiler", "torch._C._functorch", "torch.cuda._sleep",
                         "torch.cuda.profiler", "torch._subclasses", "torch.overrides")
_TORCH_C_SWITCH = re.compile(r"(?i)dispatch|mode|tls|profil|kineto|record_?function|guard|exclude|include|"
                             r"^_?(disable|enable|set_|unset_|pop|push)|_sleep|callback|hook")
_INTROSPECTION = ("sys._getframe", "sys._current_frames", "sys.setprofile", "sys.getprofile", "sys.settrace",
                  "sys.gettrace", "sys.monitoring", "sys.modules", "sys._xoptions", "threading.setprofile",
                  "threading.settrace", "threading.setprofile_all_threads", "threading.settrace_all_threads",
                  "gc.get_objects", "gc.get_referrers", "gc.get_referents", "inspect", "traceback.extract_stack",
                  "traceback.walk_stack", "traceback.format_stack", "traceback.print_stack", "builtins.__import__",
                  "__import__", "importlib", "exec", "eval", "compile", "builtins.exec", "builtins.eval",
                  "builtins.compile", "vars", "globals", "builtins.vars", "builtins.globals", "sys.__dict__",
                  "cProfile", "_lsprof")
_FRAME_ATTRIBUTES = frozenset({"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame",
                               "ag_frame", "__globals__", "__closure__", "__code__"})
# The interpreter's hooks and frames by their own names, whatever object they are reached on (`x.sys.setprofile`,
# `getattr(m, "settrace")`): no kernel needs them, and a forger needs only one.
_HOOK_ATTRIBUTES = frozenset({"setprofile", "getprofile", "settrace", "gettrace", "_getframe", "_current_frames",
                              "setprofile_all_threads", "settrace_all_threads", "_setprofileallthreads",
                              "_settraceallthreads"})
# Modules whose members a getattr with a name these rules cannot compute may reach.
_SENSITIVE_ROOTS = ("torch", "sys", "builtins", "cuda_eval", "importlib", "gc", "inspect", "threading", "time",
                    "traceback")
_CPP_HARNESS_PATTERN = re.compile(
    r"ExcludeDispatchKeyGuard|IncludeDispatchKeyGuard|tls_set_dispatch_key|tls_local_dispatch_key|"
    r"DispatchKey::Python|PythonDispatch|TorchDispatchMode|DisableTorchDispatch|PythonTLSSnapshot|"
    r"\bcupti|\bCUpti|\bCUPTI|kineto|Kineto|RecordFunction|torch::profiler|autograd::profiler|cuda_eval|"
    r"PyEval_SetProfile|PyEval_SetTrace|c_profilefunc|c_tracefunc|c_profileobj|c_traceobj")
# Modules that other modules re-export as attributes (`os.sys`, `torch.sys`, `F.torch`): a path through one of them
# is the module's own path (`os.sys.setprofile` is `sys.setprofile`), so no rule is dodged by a detour.
_REEXPORTED_MODULES = frozenset({"sys", "os", "builtins", "importlib", "gc", "inspect", "threading", "traceback",
                                 "ctypes", "subprocess", "_thread", "multiprocessing", "torch", "cuda_eval"})
RESERVED_KERNEL_NAMES = frozenset({"cuda_eval_gate", "digest_lanes", "digest_tree"})
_GLOBAL_PATTERN = re.compile(r"\b__global__\b")
_PASS_WORD = re.compile(r"\bpass\b")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
_KERNEL_NAME = re.compile(r"\b__global__\b[^;{}()]*?\b([A-Za-z_]\w*)\s*(?:<[^;{}()]*>)?\s*\(")


@dataclasses.dataclass(frozen=True)
class StaticPolicy:
    """Which static rules apply. Defaults are Kevin's policy plus the KernelBench-hack extras."""
    require_cuda_kernel: bool = True       # some string of the program contains a `__global__` function
    require_load_inline: bool = True       # the program calls load_inline (or cpp_extension.load)
    forbid_torch_in_forward: bool = True   # no torch compute in ModelNew.forward and the helpers it reaches
    forbid_try_except: bool = True         # no try/except anywhere (Kevin: fallbacks to PyTorch)
    forbid_reference_model: bool = True    # no `Model` (subclassing, calling, importing)
    forbid_monkeypatch: bool = True        # no assignment to attributes of torch/time/builtins/... or sys.modules
    forbid_threads: bool = True            # no threading/multiprocessing/asyncio imports, no C++ threads
    forbid_native_escape: bool = True      # no dlsym/pthread_create/clone/fork/exec/system/syscall, ctypes, os.fork
    forbid_pass: bool = False              # KernelBench's rule: no `pass` (a ModelNew(Model): pass bypass)
    forbid_harness_access: bool = True     # no cuda_eval, torch dispatch/profiler switches, frames, profile hooks
    forbid_undispatched_library_ops: bool = True  # no library GEMM/conv/attention ops below the dispatcher (C++)

    @classmethod
    def named(cls, name: str) -> "StaticPolicy":
        """'kevin' (default), 'cpu' (Kevin's without the __global__ rule: CPU-mode C++ candidates), 'kernelbench'
        (Kevin's plus KernelBench's `pass` rule: scoring.py decides which flags reject), 'off'."""
        if name == "kevin":
            return cls()
        if name == "kernelbench":
            return cls(forbid_pass=True)
        if name == "cpu":
            return cls(require_cuda_kernel=False)
        if name == "off":
            return cls(**{f.name: False for f in dataclasses.fields(cls)})
        raise ValueError(f"unknown static policy {name!r}: expected 'kevin', 'cpu', 'kernelbench' or 'off'")


def is_torch_compute_call(name: str) -> bool:
    """Whether a torch function or tensor method seen called from Python at run time ("torch.relu",
    "torch._C._nn.linear", "Tensor.sum") computes, by the lists of the static rule."""
    owner, _, attr = name.rpartition(".")
    base = attr[:-1] if attr.endswith("_") and not attr.endswith("__") else attr
    if owner == "Tensor":
        return attr in _TENSOR_COMPUTE_METHODS or base in _TENSOR_COMPUTE_METHODS
    if not owner or attr.startswith("_") or owner.startswith(_TORCH_ALLOWED_NAMESPACES):
        return False
    return base not in _TORCH_ALLOWED_CALLS and attr not in _TORCH_ALLOWED_CALLS and base not in _TORCH_NOT_COMPUTE


def cuda_kernel_names(sources: Iterable[str]) -> list[str]:
    """Names of the `__global__` functions defined in these CUDA source strings (sorted, unique)."""
    names = set()
    for source in sources:
        for match in _KERNEL_NAME.finditer(_LAUNCH_BOUNDS.sub(" ", source)):
            names.add(match.group(1))
    return sorted(names - {"void", "static", "inline", "extern"})


def static_check(code: str, policy: StaticPolicy | None = None) -> list[HackFlag]:
    """Flags for `code` (a candidate program) under `policy`. A syntax error gives no flags: the compile stage reports
    it with the interpreter's message. Never raises on any string."""
    policy = policy or StaticPolicy()
    try:
        tree = pysource.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    try:
        return _Checker(tree, policy, code).run()
    except RecursionError:  # absurdly nested code: reject rather than crash the evaluator
        return [HackFlag("torch_in_forward", "program too deeply nested to analyse")]


class _Checker:
    def __init__(self, tree: ast.Module, policy: StaticPolicy, source: str = ""):
        self.tree = tree
        self.source = source
        self.policy = policy
        self.flags: list[HackFlag] = []
        self.aliases = _import_aliases(tree)  # local name -> dotted module/object path
        self.bindings: dict[str, str] = {}       # name = <expr this checker resolves>, anywhere in the program
        self.string_bindings: dict[str, str] = {}  # name = <string it can compute>
        self._bind_names()
        self.strings = [s for s in _string_constants(tree)]
        self.functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.model_new = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ModelNew"),
                              None)

    def flag(self, code: str, reason: str) -> None:
        if not any(f.code == code and f.reason == reason for f in self.flags):
            self.flags.append(HackFlag(code, reason))

    def run(self) -> list[HackFlag]:
        p = self.policy
        if p.require_cuda_kernel and not any(_GLOBAL_PATTERN.search(s) for s in self.strings):
            self.flag("no_cuda_kernel", "no CUDA kernel: no `__global__` function in the program's sources")
        if p.require_load_inline and not self._calls_load_inline():
            self.flag("no_load_inline", "the kernel is not built with torch.utils.cpp_extension.load_inline")
        if p.forbid_try_except:
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))) and node.handlers:
                    self.flag("try_except", f"try/except at line {node.lineno}: fallbacks are not allowed")
                    break
        if p.forbid_pass:
            self._check_pass()
        if p.forbid_reference_model:
            self._check_reference_model()
        if p.forbid_monkeypatch:
            self._check_monkeypatch()
        if p.forbid_threads:
            self._check_threads()
        if p.forbid_native_escape:
            self._check_native_escape()
        if p.forbid_harness_access:
            self._check_harness_access()
        if p.forbid_undispatched_library_ops:
            self._check_undispatched_library_ops()
        if p.forbid_torch_in_forward and self.model_new is not None:
            self._check_forward()
        return self.flags

    # --- rules ---------------------------------------------------------------------------------------------------
    def _check_pass(self) -> None:
        # As KernelBench's checker reads it: the word `pass` anywhere outside `#` and `//` comments, source strings
        # included, so that its verdicts are reproduced exactly (a `pass` is how `class ModelNew(Model): pass`
        # inherits the reference).
        for lineno, line in enumerate(self.source.split("\n"), 1):
            code = line.split("#", 1)[0].split("//", 1)[0]
            if _PASS_WORD.search(code):
                self.flag("pass_statement", f"`pass` at line {lineno} (KernelBench rejects it: inheritance bypass)")
                return

    def _calls_load_inline(self) -> bool:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                path = self._resolve(node.func)
                if path and path.split(".")[-1] in ("load_inline", "load") and (
                        "cpp_extension" in path or path in ("load_inline",)):
                    return True
        return False

    def _check_reference_model(self) -> None:
        own_models = [n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]
        own_model = bool(own_models)
        inside_own = {id(n) for m in own_models for n in ast.walk(m)}  # a verbatim copy refers to itself
        if self.model_new is not None:
            for base in self.model_new.bases:
                if _mentions_model(base):
                    self.flag("reference_model", "ModelNew subclasses the reference Model")
        for node in ast.walk(self.tree):
            if id(node) in inside_own:
                continue
            if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
                what = "its own copy of the reference Model" if own_model else "the reference Model"
                self.flag("reference_model", f"line {node.lineno} uses {what}")
                return
            if isinstance(node, ast.Attribute) and node.attr == "Model" and not self._is_torch_path(node):
                self.flag("reference_model", f"line {node.lineno} reaches the reference Model through an attribute")
                return
            if isinstance(node, ast.ImportFrom) and any(a.name == "Model" for a in node.names):
                self.flag("reference_model", f"line {node.lineno} imports Model")
                return

    def _check_monkeypatch(self) -> None:
        for s in self.strings:
            m = _CPP_ATEN_REGISTRATION.search(_without_cpp_comments(s))
            if m:
                self.flag("monkeypatch", f"C++ source registers kernels for ATen's own ops ({m.group(0).strip()})")
                break
        for node in ast.walk(self.tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            for target in targets:
                for t in _flatten_targets(target):
                    if isinstance(t, ast.Attribute):
                        path = self._resolve(t.value)
                        if path and path.split(".")[0] in _PROTECTED_MODULES:
                            self.flag("monkeypatch", f"line {node.lineno} replaces {path}.{t.attr}")
                    elif isinstance(t, ast.Subscript):
                        path = self._resolve(t.value)
                        if path in ("sys.modules", "builtins.__dict__") or (
                                path and path.split(".")[0] in _PROTECTED_MODULES and path.endswith("__dict__")):
                            self.flag("monkeypatch", f"line {node.lineno} writes into {path}")
            if isinstance(node, ast.Call):
                path = self._resolve(node.func)
                if path and self._registers_aten(path, node):
                    self.flag("monkeypatch", f"line {node.lineno} registers a kernel for ATen's own ops ({path})")
                if path in ("setattr", "builtins.setattr", "delattr", "builtins.delattr") and node.args:
                    obj = self._resolve(node.args[0])
                    if obj and obj.split(".")[0] in _PROTECTED_MODULES:
                        self.flag("monkeypatch", f"line {node.lineno} calls {path} on {obj}")

    def _registers_aten(self, path: str, node: ast.Call) -> bool:
        """torch.library.Library("aten", ...), torch.library.impl("aten::mm", ...), register_kernel and friends, or
        a Python kernel put on an aten op (torch.ops.aten.mm.default.py_impl(...))."""
        if path.startswith("torch.ops.aten.") and path.rsplit(".", 1)[-1] in ("py_impl", "_py_impl", "py_kernels"):
            return True
        if not path.startswith("torch.library."):
            return False
        names = [self._const_str(a) for a in list(node.args[:1]) + [k.value for k in node.keywords
                                                                     if k.arg in ("ns", "qualname", "name")]]
        return any(n is not None and (n.strip() in ("aten", "_") or n.strip().startswith("aten::")) for n in names)

    def _imported_modules(self, node: ast.AST) -> list[str]:
        """The modules a node imports: import / from-import statements, and __import__ or importlib.import_module
        called with a literal name."""
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.module:
            return [node.module]
        if isinstance(node, ast.Call) and self._resolve(node.func) in ("__import__", "importlib.import_module") \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            return [node.args[0].value]
        return []

    def _check_threads(self) -> None:
        for node in ast.walk(self.tree):
            for mod in self._imported_modules(node):
                if mod.split(".")[0] in _THREAD_MODULES:
                    self.flag("thread", f"line {node.lineno} imports {mod}")
        for s in self.strings:
            m = _CPP_THREAD_PATTERN.search(s)
            if m:
                self.flag("thread", f"C++ source starts threads ({m.group(0).strip()})")
                break

    def _check_native_escape(self) -> None:
        for s in self.strings:
            m = _NATIVE_RARE_PATTERN.search(s) or _NATIVE_COMMON_PATTERN.search(
                _CPP_COMMENT_OR_LITERAL.sub(" ", s))
            if m:
                what = next((g for g in m.groups() if g), m.group(0).strip())
                self.flag("native_escape", f"C++ source uses {what}")
                break
        for s in self.strings:
            m = _CPP_PYTHON_PATTERN.search(s) or _CPP_PYBIND_PATTERN.search(_CPP_COMMENT_OR_LITERAL.sub(" ", s))
            if m:
                self.flag("native_escape", f"C++ source reaches the Python interpreter ({m.group(0).strip()})")
                break
        for node in ast.walk(self.tree):
            mods = self._imported_modules(node)
            if not mods and isinstance(node, ast.Call):
                path = self._resolve(node.func) or ""
                if _NATIVE_PY_CALLS.match(path):
                    self.flag("native_escape", f"line {node.lineno} calls {path}")
            for mod in mods:
                if mod.split(".")[0] in _NATIVE_PY_MODULES:
                    self.flag("native_escape", f"line {node.lineno} imports {mod}")
            if isinstance(node, ast.ImportFrom) and node.module in ("os", "posix"):
                for a in node.names:
                    if _NATIVE_PY_CALLS.match(f"os.{a.name}"):
                        self.flag("native_escape", f"line {node.lineno} imports os.{a.name}")

    def _check_undispatched_library_ops(self) -> None:
        """ATen's library ops called below the dispatcher from C++ (at::cpu::mm, at::native::convolution,
        at::_ops::mm::redispatch, at::cuda::blas::gemm): library_heavy_op, as their dispatched forms are at run time
        (which the op tracer sees, and these it does not)."""
        for s in self.strings:
            code = _CPP_COMMENT_OR_LITERAL.sub(" ", s)
            m = _CPP_ATEN_BLAS.search(code)
            if m:
                self.flag("library_heavy_op", f"C++ source calls a library GEMM below the dispatcher ({m.group(0)})")
                return
            for m in _CPP_UNDISPATCHED.finditer(code):
                op = re.sub(r"(_outf|_out|_symint)+$", "", m.group(2))
                if op in LIBRARY_HEAVY_OPS or op.rstrip("_") in LIBRARY_HEAVY_OPS:
                    call = "".join(m.group(0).split())
                    self.flag("library_heavy_op", f"C++ source calls a library op below the dispatcher ({call})")
                    return

    def _check_harness_access(self) -> None:
        """References to our modules, torch's dispatch/profiler switches or the interpreter's frames and hooks,
        followed through import aliases, plain assignments, getattr with names built from string constants,
        sys.modules[...], importlib.import_module(...) and __import__(...); a getattr on torch, sys, builtins... whose
        name these rules cannot compute counts as such a reference."""
        for node in ast.walk(self.tree):
            reason = None
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [f"{node.module}.{a.name}" for a in node.names if node.module] + ([node.module] if node.module
                                                                                      else [])
                reason = next((r for r in (_harness_reason(m) for m in mods) if r), None)
            elif isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRIBUTES:
                reason = f"reads the interpreter's frames or function internals (.{node.attr})"
            elif isinstance(node, ast.Attribute) and node.attr in _HOOK_ATTRIBUTES:
                reason = f"reaches the interpreter's profile hooks or frames (.{node.attr})"
            elif isinstance(node, (ast.Attribute, ast.Name, ast.Subscript, ast.Call)):
                path = self._resolve(node)
                reason = _harness_reason(path) if path else None
                if reason is None and isinstance(node, ast.Call):
                    reason = self._opaque_lookup(node)
            if reason:
                self.flag("harness_access", f"line {getattr(node, 'lineno', '?')} {reason}")
                return
        named = sorted((set(self.strings) | set(self.string_bindings.values())) &
                       (_HOOK_ATTRIBUTES | _FRAME_ATTRIBUTES))
        if named:  # `attrgetter("setprofile")`, `vars(sys)["settrace"]`: the name alone, however it is used
            self.flag("harness_access", f"names one of the interpreter's hooks or frame internals ({named[0]!r})")
            return
        for s in self.strings:
            if "cuda_eval" in s and not _GLOBAL_PATTERN.search(s):
                self.flag("harness_access", "a string of the program names the evaluator's modules (cuda_eval)")
                return
            m = _CPP_HARNESS_PATTERN.search(s) if _GLOBAL_PATTERN.search(s) or "#include" in s else None
            if m:
                self.flag("harness_access", f"C++ source reaches torch's dispatch or profiler internals "
                                            f"({m.group(0)})")
                return
        reserved = RESERVED_KERNEL_NAMES & set(cuda_kernel_names(self.strings))
        if reserved:
            self.flag("harness_access", f"a kernel is named like one of the evaluator's own ({sorted(reserved)[0]})")

    def _opaque_lookup(self, node: ast.Call) -> str | None:
        """getattr(<torch, sys, builtins, our modules...>, <a name these rules cannot compute>)."""
        func = self._resolve(node.func)
        if func not in ("getattr", "builtins.getattr") or len(node.args) < 2:
            return None
        name = self._const_str(node.args[1])
        if name in _HOOK_ATTRIBUTES:
            return f"reaches the interpreter's profile hooks or frames (getattr {name!r})"
        owner = self._resolve(node.args[0])
        if owner and owner.split(".")[0] in _SENSITIVE_ROOTS and name is None:
            return f"looks up a computed name on {owner} (getattr)"
        return None

    def _check_forward(self) -> None:
        methods = {n.name: n for n in self.model_new.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if "forward" not in methods:
            return
        module_attrs = self._init_module_attributes(methods.get("__init__"))
        # Walk forward and everything it reaches through self.<method>() and module-level functions.
        todo, seen = [("ModelNew.forward", methods["forward"])], set()
        while todo:
            label, fn = todo.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            for node in ast.walk(fn):
                if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                    self.flag("torch_in_forward", f"{label} line {node.lineno}: `@` matrix multiply in PyTorch")
                if isinstance(node, ast.Call):
                    self._check_call(label, node, module_attrs)
                    callee = node.func
                    if isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name) and \
                            callee.value.id == "self" and callee.attr in methods:
                        todo.append((f"ModelNew.{callee.attr}", methods[callee.attr]))
                    elif isinstance(callee, ast.Name) and callee.id in self.functions:
                        todo.append((callee.id, self.functions[callee.id]))

    def _init_module_attributes(self, init: ast.AST | None) -> dict[str, str]:
        """self.<attr> = <torch thing> assignments in __init__: attr -> dotted path of what it holds."""
        found: dict[str, str] = {}
        if init is None:
            return found
        for node in ast.walk(init):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                            target.value.id == "self":
                        value = node.value.func if isinstance(node.value, ast.Call) else node.value
                        path = self._resolve(value)
                        if path and path.startswith("torch"):
                            kind = "instance" if isinstance(node.value, ast.Call) else "function"
                            found[target.attr] = f"{kind}:{path}"
        return found

    def _check_call(self, label: str, node: ast.Call, module_attrs: dict[str, str]) -> None:
        func = node.func
        where = f"{label} line {node.lineno}"
        path = self._resolve(func)
        if path and path.startswith("torch."):
            if self._torch_call_is_compute(path):
                self.flag("torch_in_forward", f"{where}: calls {path}")
            return
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" and \
                func.attr in module_attrs:
            kind, held = module_attrs[func.attr].split(":", 1)
            cls = held.split(".")[-1]
            if kind == "function" and self._torch_call_is_compute(held):
                self.flag("torch_in_forward", f"{where}: calls self.{func.attr} = {held}")
            elif kind == "instance" and ".nn." in f".{held}." and cls not in _NN_CONTAINERS:
                self.flag("torch_in_forward", f"{where}: runs the PyTorch module self.{func.attr} ({held})")
            return
        if isinstance(func, ast.Attribute) and func.attr in _TENSOR_COMPUTE_METHODS:
            if path is None or not path.startswith(("math.", "np.", "numpy.")):
                owner = _expr_text(func.value)
                if not self._is_extension_object(func.value):
                    self.flag("torch_in_forward", f"{where}: tensor method {owner}.{func.attr}()")

    def _torch_call_is_compute(self, path: str) -> bool:
        if path.startswith(_TORCH_ALLOWED_NAMESPACES):
            return False
        parts = path.split(".")
        if parts[:2] == ["torch", "ops"]:
            return len(parts) > 2 and parts[2] in ("aten", "prims", "quantized", "_caffe2")
        if len(parts) >= 3 and parts[1] == "nn" and parts[2] not in ("functional", "init"):
            return parts[-1] not in _NN_CONTAINERS  # instantiating/running an nn module class inside forward
        if len(parts) >= 3 and parts[1] == "nn" and parts[2] == "init":
            return False
        if len(parts) >= 3 and parts[1] in ("Tensor", "_C"):
            return parts[-1] in _TENSOR_COMPUTE_METHODS or parts[1] == "_C"
        return parts[-1] not in _TORCH_ALLOWED_CALLS

    def _is_extension_object(self, expr: ast.expr) -> bool:
        """True for a name bound to the result of load_inline (ext.relu(x) is the candidate's own function)."""
        names = []
        while isinstance(expr, ast.Attribute):  # self.kernel.matmul: "kernel" may hold the extension
            names.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name):
            names.append(expr.id)
        return bool(set(names) & self._extension_names())

    def _extension_names(self) -> set[str]:
        if not hasattr(self, "_ext_names"):
            names = set()
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    path = self._resolve(node.value.func) or ""
                    if path.split(".")[-1] in ("load_inline", "load"):
                        for t in node.targets:
                            for n in _flatten_targets(t):
                                if isinstance(n, ast.Name):
                                    names.add(n.id)
                                elif isinstance(n, ast.Attribute):
                                    names.add(n.attr)
            self._ext_names = names
        return self._ext_names

    # --- name resolution -----------------------------------------------------------------------------------------
    def _resolve(self, expr: ast.expr, depth: int = 0) -> str | None:
        """Dotted path of an expression, import aliases and plain assignments expanded (F.relu ->
        torch.nn.functional.relu), through getattr(x, <string>), sys.modules[<string>], vars(x)[<string>],
        x.__dict__[<string>], importlib.import_module(<string>) and __import__(<string>), where the string is built
        from constants (+, f-strings, str.join, names bound to such strings)."""
        if depth > 16:
            return None
        parts = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        base = None
        # Only a path that starts at a module (an import, a name bound to one, a module lookup) may be a detour
        # through a re-exported module: `self.gc.weight` is an attribute of an object, not the gc module.
        from_module = True
        if isinstance(expr, ast.Name):
            base = self.aliases.get(expr.id) or self.bindings.get(expr.id) or expr.id
            from_module = expr.id in self.aliases or expr.id in self.bindings
        elif isinstance(expr, ast.Call):
            func = self._resolve(expr.func, depth + 1)
            if func in ("getattr", "builtins.getattr") and len(expr.args) >= 2:
                owner, name = self._resolve(expr.args[0], depth + 1), self._const_str(expr.args[1])
                base = f"{owner}.{name}" if owner and name is not None else None
            elif func in ("importlib.import_module", "__import__", "builtins.__import__") and expr.args:
                base = self._const_str(expr.args[0])
            elif func and func.endswith(("modules.get", "__dict__.get")) and expr.args:
                base = self._subscript_path(func.rsplit(".", 1)[0], expr.args[0], depth)
        elif isinstance(expr, ast.Subscript):
            base = self._subscript_path(self._resolve(expr.value, depth + 1), expr.slice, depth)
        if base is None:
            return None
        path = ".".join([base] + parts[::-1])
        return _through_reexports(path) if from_module else path

    def _subscript_path(self, container: str | None, key: ast.expr, depth: int) -> str | None:
        """sys.modules[k] -> k; vars(x)[k], x.__dict__[k] -> x.k."""
        name = self._const_str(key)
        if container is None or name is None:
            return None
        if container == "sys.modules":
            return name
        if container.endswith(".__dict__"):
            return f"{container[:-len('.__dict__')]}.{name}"
        return None

    def _const_str(self, expr: ast.expr, depth: int = 0) -> str | None:
        """The string an expression evaluates to, when it is built from constants only."""
        if depth > 16:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        if isinstance(expr, ast.Name):
            return self.string_bindings.get(expr.id)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left, right = self._const_str(expr.left, depth + 1), self._const_str(expr.right, depth + 1)
            return left + right if left is not None and right is not None else None
        if isinstance(expr, ast.JoinedStr):
            out = []
            for v in expr.values:
                part = self._const_str(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1)
                if part is None:
                    return None
                out.append(part)
            return "".join(out)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "join" and \
                len(expr.args) == 1 and isinstance(expr.args[0], (ast.List, ast.Tuple)):
            sep = self._const_str(expr.func.value, depth + 1)
            items = [self._const_str(e, depth + 1) for e in expr.args[0].elts]
            return sep.join(items) if sep is not None and None not in items else None
        return None

    def _bind_names(self) -> None:
        """Plain assignments anywhere (`t = sys.modules["..."]`, `f = torch.relu`, `n = "_Dis" + "able"`), followed
        until nothing changes (a name assigned twice keeps its first resolvable value)."""
        assigns = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigns.append((node.targets[0].id, node.value))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) and \
                    node.value is not None:
                assigns.append((node.target.id, node.value))
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                assigns += [(i.optional_vars.id, i.context_expr) for i in node.items
                            if isinstance(i.optional_vars, ast.Name)]
        for _ in range(4):
            changed = False
            for name, value in assigns:
                if name not in self.string_bindings:
                    text = self._const_str(value)
                    if text is not None:
                        self.string_bindings[name] = text
                        changed = True
                if name not in self.bindings and name not in self.aliases:
                    path = self._resolve(value)
                    if path is not None and path != name and "." in path or path in _HARNESS_MODULES or \
                            path in _REEXPORTED_MODULES:  # `_s = os.sys`, `_t = torch`: a module by another name
                        self.bindings[name] = path
                        changed = True
            if not changed:
                break

    def _is_torch_path(self, node: ast.Attribute) -> bool:
        path = self._resolve(node)
        return bool(path) and path.startswith("torch.")


def _without_cpp_comments(source: str) -> str:
    """C/C++ source with its comments blanked, string literals kept ("aten::mm" names an op)."""
    return _CPP_COMMENT_OR_LITERAL.sub(lambda m: m.group(1) or " ", source)


def _through_reexports(path: str) -> str:
    """The path without its detour through a module that re-exports another (`os.sys.modules` -> `sys.modules`,
    `F.torch.relu` -> `torch.relu`); the rightmost such module counts. `time.time` is no detour (same name twice)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in _REEXPORTED_MODULES and parts[i] != parts[i - 1]:
            return ".".join(parts[i:])
    return path


def _harness_reason(path: str) -> str | None:
    """Why a dotted path is harness access (None if it is not)."""
    parts = path.split(".")
    if parts[0] in _HARNESS_MODULES:
        return f"reaches the evaluator's own module ({path})"
    if any(path == m or path.startswith(m + ".") for m in _TORCH_SWITCH_MODULES):
        return f"reaches torch's dispatch, profiler or timing internals ({path})"
    if parts[:2] == ["torch", "_C"] and any(_TORCH_C_SWITCH.search(p) for p in parts[2:]):
        return f"reaches a private switch of torch ({path})"
    if any(path == m or path.startswith(m + ".") for m in _INTROSPECTION):
        return f"reaches the interpreter's frames, modules or profile hooks ({path})"
    return None


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _string_constants(tree: ast.AST) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _flatten_targets(target: ast.expr) -> Iterable[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _flatten_targets(elt)
    elif isinstance(target, ast.Starred):
        yield from _flatten_targets(target.value)
    else:
        yield target


def _mentions_model(expr: ast.expr) -> bool:
    return any((isinstance(n, ast.Name) and n.id == "Model") or (isinstance(n, ast.Attribute) and n.attr == "Model")
               for n in ast.walk(expr))


def _expr_text(expr: ast.expr) -> str:
    try:
        text = ast.unparse(expr)
    except Exception:  # ast.unparse is best effort on odd trees; the reason string only needs a hint
        return "<expr>"
    return text if len(text) <= 40 else text[:37] + "..."
