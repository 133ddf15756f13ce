"""The static record (cuda_eval.static.static_record.static_record_specs): the builds of a program read from its source,
so that the compile stage need not run it. The reading must agree with the recording wherever it answers, and must
decline (None: the program is recorded as before) wherever the program could build something else than it appears to."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuda_eval.protocol.extension_spec import spec_from_load_inline
from cuda_eval.static.static_record import static_record_specs
from cuda_eval.worker.record import CANDIDATE_FILE, TASK_FILE

REPO = Path(__file__).resolve().parents[2]

HEAD = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor f(torch::Tensor x);"
SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
'''
CALL = 'ext = load_inline(name="ext", cpp_sources=CPP, cuda_sources=SRC, functions=["f"], extra_cuda_cflags=FLAGS)\n'
MODEL = '''
class ModelNew(nn.Module):
    def forward(self, x):
        return ext.f(x)
'''


def program(*parts: str) -> str:
    return HEAD + "".join(textwrap.dedent(p) for p in parts)


def expected(flags=("-O3",), src="torch::Tensor f(torch::Tensor x) { return x; }"):
    return spec_from_load_inline(name="ext", cpp_sources="torch::Tensor f(torch::Tensor x);", cuda_sources=src,
                                 functions=["f"], extra_cuda_cflags=list(flags))


def test_a_plain_program_is_read_as_load_inline_would_see_it():
    specs = static_record_specs(program('FLAGS = ["-O3"]\n', CALL, MODEL))
    assert [s.key() for s in specs] == [expected().key()]
    # several extensions, attribute forms of the loader, string concatenation, a docstring, a plain helper
    code = program('''
        """Two extensions."""
        import torch.utils.cpp_extension as cpp_ext
        from torch.utils import cpp_extension
        FLAGS = ["-O3"]
        first = cpp_ext.load_inline(name="a", cpp_sources=CPP, cuda_sources=SRC + "\\n", functions=["f"])
        second = cpp_extension.load_inline("b", CPP, cuda_sources=[SRC], functions=["f"], extra_cuda_cflags=FLAGS)
        third = torch.utils.cpp_extension.load_inline(name="c", cpp_sources=CPP, cuda_sources=SRC, functions=["f"])
        def helper(x, scale: float = -1.0):
            return x * scale
    ''', MODEL)
    assert [s.name for s in static_record_specs(code)] == ["a", "b", "c"]


# Programs the reading must decline: each is what a program could do so that a literal-looking call builds something
# else at import than the source shows (or builds more than the calls it shows). Without the check named, the
# reading would answer with specs that differ from the recording's.
DECLINED = {
    # a second binding of an argument name
    "augmented_assignment": program('FLAGS = ["-O3"]\nFLAGS += ["-DEVIL"]\n', CALL, MODEL),
    "rebinding_in_a_function": program('FLAGS = ["-O3"]\n', '''
        class Base(nn.Module):
            def __init_subclass__(cls, **kw):
                global FLAGS
                FLAGS = ["-DEVIL"]
        class Mid(Base):
            pass
    ''', CALL, MODEL),
    # a list changed in place by code that runs at import before the call (a class hook)
    "list_mutated_by_a_class_hook": program('FLAGS = ["-O3"]\n', '''
        class Base(nn.Module):
            def __init_subclass__(cls, **kw):
                FLAGS.append("-DEVIL")
        class Mid(Base):
            pass
    ''', CALL, MODEL),
    # program code at module level before the call (plain statements only)
    "module_level_call": program('FLAGS = ["-O3"]\nSRC = SRC.replace("x;", "x * 2;")\n', CALL, MODEL),
    "module_level_loop": program('FLAGS = ["-O3"]\nfor _ in range(3):\n    CPP = CPP + " "\n', CALL, MODEL),
    "decorated_def": program('FLAGS = ["-O3"]\n', '''
        def patch(fn):
            FLAGS.append("-DEVIL")
            return fn
        @patch
        def g():
            pass
    ''', CALL, MODEL),
    "import_of_another_module": program('import ctypes\nFLAGS = ["-O3"]\n', CALL, MODEL),
    # the loader reached another way than the calls read (loader uses)
    "loader_alias_in_init": program('FLAGS = ["-O3"]\n', CALL, '''
        build = load_inline
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.more = build(name="more", cpp_sources=CPP, cuda_sources=SRC, functions=["f"])
            def forward(self, x):
                return ext.f(x)
    '''),
    "call_inside_init": program('FLAGS = ["-O3"]\n', CALL, '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.more = load_inline(name="more", cpp_sources=CPP, cuda_sources=SRC, functions=["f"])
            def forward(self, x):
                return ext.f(x)
    '''),
    "opaque_access": program('FLAGS = ["-O3"]\n', CALL, '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                loader = getattr(getattr(getattr(torch, "utils"), "cpp_" + "extension"), "load_" + "inline")
                self.more = loader(name="more", cpp_sources=CPP, cuda_sources=SRC, functions=["f"])
            def forward(self, x):
                return ext.f(x)
    '''),
    # code of the program's own that Python runs at import: a special method reached through an annotation
    "class_getitem_hook_in_an_annotation": program('FLAGS = ["-O3"]\n', '''
        class Hook(nn.Module):
            def __class_getitem__(cls, item):
                FLAGS.append("-DEVIL")
                return cls
        def g(x: Hook[0]):
            return x
    ''', CALL, MODEL),
    # a loader of the program's own under torch's name (the loader's binding)
    "shadowed_loader": program('''
        FLAGS = ["-O3"]
        class Identity:
            def f(self, x):
                return x
        def load_inline(**kwargs):
            return Identity()
    ''', CALL, MODEL),
    "loader_shadowed_by_a_class": program('''
        FLAGS = ["-O3"]
        class load_inline(nn.Module):
            def __init__(self, **kwargs):
                super().__init__()
    ''', CALL, MODEL),
    "loader_rebound_by_assignment": program('FLAGS = ["-O3"]\nload_inline = "not the loader any more"\n', CALL, MODEL),
    # a call under a condition, not a statement of the module
    "conditional_call": program('FLAGS = ["-O3"]\nif torch.cuda.is_available():\n    ' + CALL, MODEL),
    # things only the recording can judge
    "no_model_new": program('FLAGS = ["-O3"]\n', CALL),
    "syntax_error": program('FLAGS = ["-O3"\n', CALL, MODEL),
    "no_loader_call": program('FLAGS = ["-O3"]\n', MODEL),
    "argument_not_literal": program('FLAGS = ["-O" + str(3)]\n', CALL, MODEL),
    "starred_arguments": program('ARGS = {"name": "ext", "cpp_sources": CPP}\next = load_inline(**ARGS)\n', MODEL),
}


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_the_reading_declines_what_it_cannot_vouch_for(name):
    assert static_record_specs(DECLINED[name]) is None


RED_TEAM = REPO / "tests" / "cuda_eval" / "data" / "static_record_declined"


@pytest.mark.parametrize("path", sorted(RED_TEAM.glob("*.py")), ids=lambda p: p.stem)
def test_programs_an_adversary_wrote_against_the_reading_are_declined(path):
    """Programs written, with this module's source at hand, so that an earlier reading answered and the recording
    disagreed (docs/LOG.md, "static record"): a statement that raises before the call (`1 + "a"`, an undefined
    name, `class A(bool)`, a missing name of an allowed module, a builtin as a class hook), errors only compile()
    reports (`break` outside a loop, a repeated parameter or keyword, a late __future__ import), the loader imported
    after the call or only in a function, torch reached under another name inside a method (`import torch as T`,
    `from torch import utils`, `t = torch`), code run at class creation (__init_subclass__, an Enum's __init__, a
    __class_getitem__ reached through an annotation) that adds a build, mutates a list through the module object,
    rebinds a global through a frame, monkeypatches the loader or exits, `tuple + list`, and a 500-link attribute
    chain that made the reading itself raise."""
    assert static_record_specs(path.read_text()) is None


def _record_in_subprocess(programs: list[tuple[str, str]], tmp_path) -> list[list[str]]:
    """The spec keys cuda_eval.worker.record gives each (task, code) pair: one process records them all (our own
    programs, trusted), so that torch is imported once."""
    dirs = []
    for i, (task, code) in enumerate(programs):
        d = tmp_path / f"p{i}"
        d.mkdir()
        (d / TASK_FILE).write_text(task)
        (d / CANDIDATE_FILE).write_text(code)
        dirs.append(str(d))
    # a fork per program after one torch import: some programs end their process (os._exit) once they have built
    script = textwrap.dedent('''
        import json, os, sys
        import torch
        from cuda_eval.protocol.extension_spec import ExtensionSpec
        from cuda_eval.worker import record
        for d in sys.argv[1:]:
            pid = os.fork()
            if pid == 0:
                sys.stdout = sys.stderr = open(os.devnull, "w")
                record.record(d)
                os._exit(0)
            os.waitpid(pid, 0)
            with open(os.path.join(d, record.RECORD_FILE)) as f:
                specs = json.load(f)["specs"]
            print(json.dumps(list(dict.fromkeys(ExtensionSpec.from_dict(s).key() for s in specs))), flush=True)
    ''')
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script, *dirs], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == len(programs), out.stderr[-3000:]
    return [json.loads(line) for line in lines]


def test_the_reading_agrees_with_the_recording_on_the_repository_programs(tmp_path):
    """Every honest and bad corpus program, every benchmarks/candidates program and every built-in solution: where
    the reading answers, its specs are the recording's, in order; and it answers for nearly all of them (the point:
    a record process and a torch import saved per candidate; docs/LOG.md, "static record")."""
    sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))
    import corpus_index
    from kevin_jax.tasks import builtin_solutions, load_builtin_tasks
    programs = [(c.task_source, c.code) for kind in ("honest", "bad") for c in corpus_index.load(kind)]
    bench = REPO / "benchmarks" / "candidates"
    programs += [((bench / "tasks" / p.name).read_text(), p.read_text()) for p in sorted(bench.glob("*.py"))]
    tasks = {t.task_id: t.source for t in load_builtin_tasks().tasks}
    programs += [(tasks[s.task_id], s.source) for s in builtin_solutions()]
    read = [static_record_specs(code) for _, code in programs]
    answered = [(p, specs) for p, specs in zip(programs, read) if specs is not None]
    assert len(answered) >= 0.9 * len(programs), f"read {len(answered)} of {len(programs)}"
    recorded = _record_in_subprocess([p for p, _ in answered], tmp_path)
    for (_, code), specs, keys in zip(answered, [s for _, s in answered], recorded):
        assert [s.key() for s in specs] == keys, code[:400]
