"""The builds a program asks for, read from its source without running it (the trainer's process).

- `speculate_specs(code)`: the extensions a program will most likely build (module-level load_inline calls with
  literal arguments): the compile pool starts building them while the program is still being recorded.
- `static_record_specs(code)`: the complete answer, when the source makes it certain; then no recorder runs at all.
Both read the text with `ast`; neither imports torch or executes the program.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util

from cuda_eval.protocol.extension_spec import ExtensionSpec, spec_from_load_inline
from cuda_eval.static import pysource


class _NotStatic(Exception):
    pass


def _static_value(node, env: dict):
    """The value of a literal-ish expression: constants, names bound to such values, lists/tuples/dicts of them,
    + of strings/lists, and implicit string concatenation. Anything else raises _NotStatic."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _NotStatic(node.id)
    if isinstance(node, ast.List):
        return [_static_value(e, env) for e in node.elts]
    if isinstance(node, ast.Tuple):       # a tuple stays one: ("-O3",) + ["-g"] raises in Python, so it must here
        return tuple(_static_value(e, env) for e in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_static_value(k, env): _static_value(v, env) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _static_value(node.left, env), _static_value(node.right, env)
        if type(left) is type(right) and isinstance(left, (str, list, tuple)):
            return left + right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _static_value(node.operand, env)
        if type(value) in (int, float):
            return -value if isinstance(node.op, ast.USub) else value
    raise _NotStatic(type(node).__name__)


def speculate_specs(code: str) -> list[ExtensionSpec]:
    """The extensions a program will most likely build, read statically (without running it): module-level
    `x = load_inline(...)` calls whose arguments are literals or module-level constants. Used to start building
    while the program is still being recorded; the recorded specs remain the truth. Never raises; [] if unsure."""
    try:
        tree = pysource.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, SystemError):
        return []
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree)):
        return []
    env: dict = {}
    specs: list[ExtensionSpec] = []
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
        if isinstance(value, ast.Call):
            fn = value.func
            fname = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if fname == "load_inline":
                try:
                    args = [_static_value(a, env) for a in value.args]
                    kwargs = {k.arg: _static_value(k.value, env) for k in value.keywords if k.arg}
                    if any(k.arg is None for k in value.keywords):
                        raise _NotStatic("**kwargs")
                    specs.append(spec_from_load_inline(*args, **kwargs))
                except Exception:  # noqa: BLE001 - not statically knowable: the recording will tell
                    pass
                continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                env[stmt.targets[0].id] = _static_value(stmt.value, env)
            except _NotStatic:
                env.pop(stmt.targets[0].id, None)
    return specs


# --- static record ---------------------------------------------------------------------------------------------
# The reading answers only for programs whose import runs nothing of their own before their builds: these imports,
# literal assignments, plain functions and nn.Module classes, and the loader calls. Anything else is recorded.
_LOADER = "torch.utils.cpp_extension.load_inline"
_TORCH_MODULES = frozenset({"torch", "torch.nn", "torch.nn.functional", "torch.utils", "torch.utils.cpp_extension"})
_TORCH_FROM = frozenset({("torch.utils.cpp_extension", "load_inline"), ("torch.utils", "cpp_extension"),
                         ("torch", "nn"), ("torch", "Tensor"), ("torch.nn", "functional"), ("torch.nn", "Module")})
_STDLIB_PLAIN = frozenset({"math", "typing", "functools", "itertools", "collections", "dataclasses", "numbers",
                           "abc", "os"})
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})
# Names through which a program can reach its module's namespace, a frame or the loader unseen.
_OPAQUE_NAMES = frozenset({"exec", "eval", "compile", "getattr", "setattr", "delattr", "globals", "locals", "vars",
                           "__import__", "__builtins__", "builtins", "importlib", "sys", "inspect", "__dict__",
                           "__class__", "__globals__", "__code__", "__getattribute__", "__setattr__", "f_globals",
                           "f_locals", "f_back", "__subclasses__", "__mro__", "__bases__", "__base__"})
# Attributes that lead to the loader: outside a call read as one, the program reaches it some other way.
_LOADER_ATTRIBUTES = frozenset({"cpp_extension", "load_inline"})
_MAX_DOTTED = 64


def _dotted(node) -> str | None:
    """"a.b.c" for a chain of attributes on a name (iteratively: a 500-deep chain must not recurse), else None."""
    parts = []
    while isinstance(node, ast.Attribute) and len(parts) < _MAX_DOTTED:
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _no_call(node) -> bool:
    return not any(isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom))
                   for n in ast.walk(node))


class _Reading:
    """One program's static reading (static_record_specs). Every check returns False / raises _NotStatic to
    decline."""

    def __init__(self, tree):
        self.tree = tree
        self.modules: dict[str, str] = {}   # identifier -> what it names: "torch.nn", "torch.utils.cpp_extension...
        self.env: dict = {}                 # module-level names bound to literal values, at the current statement
        self.specs: list[ExtensionSpec] = []
        self.loader_funcs: list = []         # the func node of every loader call read

    def resolve(self, node) -> str | None:
        """The torch path an expression names (`nn.Module` -> "torch.nn.Module"), or None."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in self.modules:
            return None
        return self.modules[head] + ("." + rest if rest else "")

    def plain_import(self, stmt) -> bool:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name in _TORCH_MODULES:
                    name = alias.asname or alias.name.split(".")[0]
                    target = alias.name if alias.asname else "torch"
                    self.modules[name] = target
                elif alias.name in _STDLIB_PLAIN or (alias.name == "numpy"
                                                     and importlib.util.find_spec("numpy") is not None):
                    pass
                else:
                    return False
            return True
        if stmt.level or not stmt.module:
            return False
        for alias in stmt.names:
            if (stmt.module, alias.name) in _TORCH_FROM:
                self.modules[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
            elif stmt.module in _STDLIB_PLAIN and alias.name != "*" and \
                    hasattr(importlib.import_module(stmt.module), alias.name):
                pass
            else:
                return False                # unknown module, a name it lacks, `*`, __future__ (must come first)
        return True

    def plain_def(self, stmt, in_class: bool) -> bool:
        """A def whose creation runs nothing of the program's: plain decorators, literal defaults, annotations
        without calls; in a class, no special method but __init__ (no __init_subclass__, __class_getitem__,
        __set_name__, __new__ ... that Python would call at import)."""
        a = stmt.args
        if in_class and stmt.name.startswith("__") and stmt.name.endswith("__") and stmt.name != "__init__":
            return False
        if not all(isinstance(d, ast.Name) and d.id in _PLAIN_DECORATORS for d in stmt.decorator_list):
            return False
        for default in [*a.defaults, *(d for d in a.kw_defaults if d is not None)]:
            _static_value(default, self.env)
        annotations = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                       if x is not None and x.annotation is not None] + ([stmt.returns] if stmt.returns else [])
        return all(_no_call(n) for n in annotations)

    def plain_class(self, stmt) -> bool:
        """A class of nn.Module (or of nothing), no keywords, no decorators, a body of plain defs and literal
        assignments: creating it runs no code of the program's."""
        if stmt.keywords or stmt.decorator_list:
            return False
        if not all(self.resolve(b) == "torch.nn.Module" for b in stmt.bases):
            return False
        for s in stmt.body:
            if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
                continue
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.plain_def(s, in_class=True):
                continue
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                    and not s.targets[0].id.startswith("__"):
                _static_value(s.value, self.env)
                continue
            return False
        return True

    def loader_call(self, value) -> bool:
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if isinstance(func, ast.Name):
            is_loader = self.modules.get(func.id) == _LOADER
        else:
            is_loader = self.resolve(func) == _LOADER
        if not is_loader:
            return False
        if any(k.arg is None for k in value.keywords) or any(isinstance(a, ast.Starred) for a in value.args):
            raise _NotStatic("*args or **kwargs")
        args = [_static_value(a, self.env) for a in value.args]
        kwargs = {k.arg: _static_value(k.value, self.env) for k in value.keywords}
        self.specs.append(spec_from_load_inline(*args, **kwargs))
        self.loader_funcs.append(func)
        return True

    def statement(self, stmt) -> bool:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            return True
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return self.plain_import(stmt)
        if isinstance(stmt, ast.Expr):
            return self.loader_call(stmt.value)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if not self.loader_call(stmt.value):
                self.env[name] = _static_value(stmt.value, self.env)     # raises if it is not a literal value
            return True
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return stmt.name not in self.modules and self.plain_def(stmt, in_class=False)
        if isinstance(stmt, ast.ClassDef):
            return stmt.name not in self.modules and self.plain_class(stmt)
        return False

    def read(self) -> list[ExtensionSpec] | None:
        if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in self.tree.body):
            return None
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id in _OPAQUE_NAMES:
                return None
            if isinstance(node, ast.Attribute) and node.attr in _OPAQUE_NAMES:
                return None
        for stmt in self.tree.body:
            if not self.statement(stmt):
                return None
        if not self.specs:
            return None
        # The loader reached nowhere but in the calls read.
        in_calls = {id(node) for f in self.loader_funcs for node in (*_links(f), _base_name(f))}
        for node in ast.walk(self.tree):
            if id(node) in in_calls:
                continue
            if isinstance(node, ast.Name) and self.modules.get(node.id, "").startswith("torch.utils"):
                return None
            if isinstance(node, ast.Attribute) and node.attr in _LOADER_ATTRIBUTES:
                return None
        return list({s.key(): s for s in self.specs}.values())


def _base_name(node):
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _links(chain):
    """The attribute nodes of a chain a.b.c (none for a bare name)."""
    while isinstance(chain, ast.Attribute):
        yield chain
        chain = chain.value


def static_record_specs(code: str) -> list[ExtensionSpec] | None:
    """The extensions a program builds, read from its source without running it, when that reading is complete:
    the specs the recording (worker/record.py) would give, in its order, or None when the program must be recorded.

    Complete means that importing the program runs nothing of its own before or between its builds, and that its
    builds are plain to see: it compiles (ast and compile(), so every syntax error the interpreter reports is the
    recording's to report); it defines ModelNew; every statement at module level is an import of torch (torch, nn,
    functional, cpp_extension, load_inline) or of a few plain standard modules (names that exist), an assignment
    of a literal value (constants, lists, tuples, dicts, `+`, names bound so before), a def with plain decorators,
    literal defaults and call-free annotations, a class of nn.Module without keywords, decorators or special
    methods but __init__ whose body is such defs and literal assignments, a docstring, or a call of torch's
    load_inline with literal arguments; no import anywhere else; torch's names never rebound at module level; the
    loader and cpp_extension reached nowhere but in those calls; nothing that can reach a namespace or a frame
    (exec, getattr, globals, sys, inspect, __dict__, f_globals ... : _OPAQUE_NAMES). Anything else returns None.
    A build the reading missed would still be built when the program asks for it at run time (install_prebuilt's
    run-time builder), and a program only ever gets modules built from the specs it passes. Never raises."""
    try:
        tree = pysource.parse(code)
        with pysource.lock():
            compile(tree, "<candidate>", "exec", dont_inherit=True)
        return _Reading(tree).read()
    except Exception:  # noqa: BLE001 - a syntax error, _NotStatic, arguments load_inline itself would refuse,
        return None    # a RecursionError on absurd nesting: the recording tells
