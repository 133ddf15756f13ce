"""Task loaders (KernelBench checkout, HF parquet/arrow export, built-in set), identity, splits, built-in solutions."""
import ast
import logging
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from kevin_jax.env import one_shot
from kevin_jax.tasks import (Split, Task, TasksConfig, builtin_solutions, default_split, load_builtin_tasks,
                             load_kernelbench_dir, load_kernelbench_parquet, load_split, load_tasks, resolve_split,
                             save_split, select)
from kevin_jax.tasks.kernelbench import normalise_source, reference_problems

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "data" / "kernelbench_layout"
GOOD = textwrap.dedent("""\
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.rand(4, 4)]

    def get_init_inputs():
        return []
    """)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- identity ---------------------------------------------------------------------------------------------------------

def test_task_id_keeps_names_verbatim():
    t = Task(1, 75, "conv_transposed_2D__grouped____padded__", GOOD)
    assert t.task_id == "L1/75_conv_transposed_2D__grouped____padded__"


def test_content_hash_ignores_line_endings_and_trailing_whitespace_only():
    a = Task(1, 1, "A", GOOD)
    crlf = Task(1, 1, "A", GOOD.replace("\n", "  \r\n") + "\n\n")
    changed = Task(1, 1, "A", GOOD.replace("relu", "tanh"))
    assert a.content_hash == crlf.content_hash
    assert a.content_hash != changed.content_hash
    assert normalise_source("a \r\nb\t\r\n\n") == "a\nb\n"


# --- the built-in set -------------------------------------------------------------------------------------------------

def test_builtin_tasks_load_completely_and_span_levels_1_and_2():
    loaded = load_builtin_tasks()
    assert loaded.skipped == ()
    ids = [t.task_id for t in loaded.tasks]
    assert len(ids) >= 14 and len(set(ids)) == len(ids)
    assert sum(t.level == 1 for t in loaded.tasks) >= 8 and sum(t.level == 2 for t in loaded.tasks) >= 5
    assert "L1/9_Large_tensor_scale__add" in ids and "L1/2_GELU_tanh_" in ids  # doubled / trailing underscores
    assert load_tasks(TasksConfig()).tasks == loaded.tasks  # the embedded default
    assert [t.level for t in load_builtin_tasks(levels=[2]).tasks] == [2] * 6


def _module_names(tree):
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}


def test_builtin_tasks_have_the_kernelbench_quirks():
    sources = {t.task_id: t.source for t in load_builtin_tasks().tasks}
    everything = "\n".join(sources.values())
    assert "torch.randint(0, num_classes" in everything            # integer targets
    assert "* 2 - 1" in everything                                  # +-1 targets
    assert "< 0.3" in sources["L1/10_Masked_fill_with_scalar"]      # bool mask
    assert "return [x, mask, fill_value]" in everything             # a non-tensor forward input
    assert "nn.Dropout" in everything and "nn.BatchNorm2d" in everything  # training-mode layers
    assert "torch.randn(bias_shape)" in everything                  # RNG in __init__
    # a large input: >= 2**27 elements
    assert "rows = 32768\ncols = 4096" in sources["L1/9_Large_tensor_scale__add"]
    # forward reads module globals
    tree = ast.parse(sources["L1/11_Clamp_with_module_globals"])
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    read = {n.id for n in ast.walk(forward) if isinstance(n, ast.Name)}
    assert {"clamp_min", "clamp_max"} <= read & _module_names(tree)
    # a helper class beside Model
    classes = [n.name for n in ast.parse(sources["L2/6_Gemm_ScaledSigmoid_Sum"]).body if isinstance(n, ast.ClassDef)]
    assert classes == ["ScaledSigmoid", "Model"]


@pytest.mark.slow
def test_builtin_references_run_on_cpu():
    """Each built-in reference builds and runs as KernelBench runs it (module exec, Model(*init), forward(*inputs))."""
    script = textwrap.dedent("""
        import sys, types, torch
        from kevin_jax.tasks import load_builtin_tasks
        torch.manual_seed(0)
        for t in load_builtin_tasks().tasks:
            mod = types.ModuleType("reference")
            exec(compile(t.source, t.path, "exec"), mod.__dict__)
            with torch.no_grad():
                out = mod.Model(*mod.get_init_inputs())(*mod.get_inputs())
            assert isinstance(out, torch.Tensor) and torch.isfinite(out).all(), t.task_id
            print(t.task_id, tuple(out.shape))
        """)
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(out.stdout.splitlines()) == len(load_builtin_tasks().tasks)


# --- a KernelBench checkout -------------------------------------------------------------------------------------------

def test_kernelbench_layout_files_with_real_quirks_load_completely():
    loaded = load_kernelbench_dir(SAMPLE_DIR)  # the repo root: finds its KernelBench/ folder
    assert loaded.skipped == ()
    assert [t.task_id for t in loaded.tasks] == [
        "L1/94_MSELoss", "L1/100_HingeLoss", "L2/83_Conv3d_GroupNorm_Min_Clamp_Dropout_OLD", "L3/36_LSTMHn",
        "L3/44_MiniGPTBlock"]
    assert load_kernelbench_dir(SAMPLE_DIR / "KernelBench", levels=[1, 2]).tasks == loaded.tasks[:3]


def test_every_real_kernelbench_file_name_loads_with_its_id_and_verbatim_name(tmp_path):
    """Levels 1-3 of KernelBench by name (file_names.txt; stub contents): 250 tasks, Kevin's 180/20 split."""
    names = [line for line in (SAMPLE_DIR / "file_names.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    for name in names:
        write(tmp_path / "KernelBench" / name, GOOD)
    loaded = load_kernelbench_dir(tmp_path)
    assert loaded.skipped == () and len(loaded.tasks) == len(names) == 250
    expected = {f"L{n.split('/')[0].removeprefix('level')}/{Path(n).stem}" for n in names}
    assert {t.task_id for t in loaded.tasks} == expected
    assert "L1/75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__" in \
        expected
    split = default_split(load_kernelbench_dir(tmp_path, levels=[1, 2]).tasks)
    assert (len(split.train), len(split.holdout)) == (180, 20)


def test_broken_references_are_skipped_with_their_file_names(tmp_path, caplog):
    write(tmp_path / "level1" / "1_Good_.py", GOOD)
    write(tmp_path / "level1" / "2_Syntax.py", GOOD.replace("def forward(self, x):", "def forward(self, x)"))
    write(tmp_path / "level1" / "3_NoInputs.py", GOOD.replace("def get_inputs", "def make_inputs"))
    write(tmp_path / "level2" / "1_NoModel.py", GOOD.replace("class Model", "class Net"))
    write(tmp_path / "level2" / "notes.py", GOOD)
    write(tmp_path / "level2" / "README.md", "not a task")
    write(tmp_path / "level2" / "__init__.py", "")
    with caplog.at_level(logging.WARNING):
        loaded = load_kernelbench_dir(tmp_path)
    assert [t.task_id for t in loaded.tasks] == ["L1/1_Good_"]
    reasons = {Path(s.path).name: s.reason for s in loaded.skipped}
    assert reasons == {"2_Syntax.py": "syntax error at line 5: expected ':'", "3_NoInputs.py": "missing get_inputs()",
                       "1_NoModel.py": "missing class Model", "notes.py": "file name is not <id>_<Name>.py"}
    for name in reasons:
        assert name in caplog.text


def test_duplicate_problem_ids_are_kept_and_logged(tmp_path, caplog):
    write(tmp_path / "level2" / "23_Conv3d_GroupNorm_Mean.py", GOOD)
    write(tmp_path / "level2" / "23_Conv3d_Mean.py", GOOD)
    with caplog.at_level(logging.WARNING):
        loaded = load_kernelbench_dir(tmp_path)
    assert len(loaded.tasks) == 2 and "used twice" in caplog.text


def test_old_versions_beside_their_live_task_are_skipped_but_a_lone_old_file_is_the_task(tmp_path, caplog):
    write(tmp_path / "level2" / "23_Conv3d_GroupNorm_Mean.py", GOOD)
    write(tmp_path / "level2" / "23_Conv3d_GroupNorm_Mean_OLD.py", GOOD)
    write(tmp_path / "level2" / "83_Conv3d_GroupNorm_Min_Clamp_Dropout_OLD.py", GOOD)
    write(tmp_path / "level3" / "__init__.py", "")
    with caplog.at_level(logging.WARNING):
        loaded = load_kernelbench_dir(tmp_path)
    assert [t.task_id for t in loaded.tasks] == ["L2/23_Conv3d_GroupNorm_Mean",
                                                 "L2/83_Conv3d_GroupNorm_Min_Clamp_Dropout_OLD"]
    assert [(Path(s.path).name, s.reason.split()[0]) for s in loaded.skipped] == [
        ("23_Conv3d_GroupNorm_Mean_OLD.py", "superseded")]
    assert "used twice" not in caplog.text
    assert "holds no loadable task" in caplog.text          # the empty level3/


def test_dir_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_kernelbench_dir(tmp_path / "missing")
    with pytest.raises(ValueError, match="no level1/"):
        load_kernelbench_dir(tmp_path)
    write(tmp_path / "level1" / "1_A.py", "x = 1\n")
    with pytest.raises(ValueError, match="no tasks loaded"):
        load_tasks(TasksConfig(kernelbench_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="not both"):
        load_tasks(TasksConfig(kernelbench_dir=str(tmp_path), parquet=str(tmp_path)))


def test_reference_problems_accepts_assigned_functions():
    assert reference_problems(GOOD.replace("def get_init_inputs():\n    return []", "get_init_inputs = list")) == []
    assert reference_problems("\x00") != []


# --- the Hugging Face export -----------------------------------------------------------------------------------------

def test_parquet_with_level_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"code": [GOOD, GOOD, "class Model: pass"], "level": [1, 2, 2],
                      "name": ["19_ReLU", "7_Conv3d_ReLU_", "9_Broken"], "problem_id": [19, 7, 9]})
    pq.write_table(table, tmp_path / "kb.parquet")
    loaded = load_kernelbench_parquet(tmp_path / "kb.parquet")
    assert [t.task_id for t in loaded.tasks] == ["L1/19_ReLU", "L2/7_Conv3d_ReLU_"]
    assert len(loaded.skipped) == 1 and "9_Broken" in loaded.skipped[0].path
    assert "missing get_inputs()" in loaded.skipped[0].reason
    assert [t.task_id for t in load_kernelbench_parquet(tmp_path / "kb.parquet", levels=[2]).tasks] == \
        ["L2/7_Conv3d_ReLU_"]


def test_parquet_dir_per_level_without_level_column_and_arrow_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    for level in (1, 2):
        table = pa.table({"code": [GOOD], "name": [f"{level}_Op{level}"], "problem_id": [level]})
        pq.write_table(table, write(tmp_path / "data" / f"level_{level}-00000-of-00001.parquet", "").with_suffix(
            ".parquet"))
    arrow = pa.table({"code": [GOOD], "name": ["3_Net"], "problem_id": [3], "level": [3]})
    with pa.OSFile(str(tmp_path / "data" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, arrow.schema) as writer:
            writer.write_table(arrow)
    loaded = load_kernelbench_parquet(tmp_path)
    assert [t.task_id for t in loaded.tasks] == ["L1/1_Op1", "L2/2_Op2", "L3/3_Net"]
    assert load_tasks(TasksConfig(parquet=str(tmp_path), levels=(1,))).tasks == loaded.tasks[:1]


def test_parquet_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"code": [GOOD], "problem_id": [1]}), tmp_path / "level_1.parquet")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['name'\]"):
        load_kernelbench_parquet(tmp_path / "level_1.parquet")
    pq.write_table(pa.table({"code": [GOOD], "problem_id": [1], "name": ["1_A"]}), tmp_path / "tasks.parquet")
    with pytest.raises(ValueError, match="no 'level' column"):
        load_kernelbench_parquet(tmp_path / "tasks.parquet")
    with pytest.raises(FileNotFoundError):
        load_kernelbench_parquet(tmp_path / "nothing.parquet")
    with pytest.raises(ValueError, match="no .parquet"):
        load_kernelbench_parquet(write(tmp_path / "empty" / "x.txt", "").parent)


# --- splits -----------------------------------------------------------------------------------------------------------

def fake_kernelbench(n_per_level=100):
    return [Task(level, i, f"Op{i}", GOOD + f"# {level} {i}\n") for level in (1, 2) for i in range(1, n_per_level + 1)]


def test_default_split_is_kevins_shape_deterministic_and_stratified():
    tasks = fake_kernelbench()
    split = default_split(tasks, 0.1, seed=0)
    assert len(split.train) == 180 and len(split.holdout) == 20
    assert sum(i.startswith("L1/") for i in split.holdout) == 10
    assert default_split(list(reversed(tasks)), 0.1, seed=0) == split      # independent of order
    assert default_split(tasks, 0.1, seed=1).holdout != split.holdout       # the seed matters
    small = default_split(load_builtin_tasks().tasks)
    assert {i[:2] for i in small.holdout} == {"L1", "L2"}                  # >= 1 held out per level


def test_split_file_round_trip_and_select(tmp_path, caplog):
    tasks = fake_kernelbench(10)
    split = default_split(tasks, 0.2, seed=3)
    save_split(split, tmp_path / "split.json")
    again = load_split(tmp_path / "split.json")
    assert again == split
    train = select(tasks, again, "train")
    assert [t.task_id for t in train] == list(split.train) and len(select(tasks, again, "all")) == 20
    drifted = [Task(t.level, t.problem_id, t.name, t.source + "x = 1\n") if t.task_id == split.holdout[0] else t
               for t in tasks]
    with caplog.at_level(logging.WARNING):
        select(drifted, again, "holdout")
    assert split.holdout[0] in caplog.text and "differs" in caplog.text


def test_resolve_split_writes_the_default_or_reads_the_configured_file(tmp_path):
    tasks = fake_kernelbench(10)
    split = resolve_split(tasks, TasksConfig(holdout_fraction=0.2, split_seed=5), write_to=tmp_path / "run" / "s.json")
    assert split == default_split(tasks, 0.2, 5) and load_split(tmp_path / "run" / "s.json") == split
    other = Split(tuple(t.task_id for t in tasks[:15]), tuple(t.task_id for t in tasks[15:]))
    save_split(other, tmp_path / "given.json")
    assert resolve_split(tasks, TasksConfig(split_file=str(tmp_path / "given.json"))) == other


def test_split_errors(tmp_path):
    tasks = fake_kernelbench(5)
    with pytest.raises(ValueError, match="not loaded"):
        select(tasks, Split(("L1/1_Op1", "L9/1_Nope"), ()), "train")
    with pytest.raises(ValueError, match="both train and holdout"):
        Split(("L1/1_Op1",), ("L1/1_Op1",))
    write(tmp_path / "bad.json", '{"train": 3}')
    with pytest.raises(ValueError, match="lists 'train' and 'holdout'"):
        load_split(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="cannot read"):
        load_split(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="holdout_fraction"):
        default_split(tasks, 1.0)


# --- built-in solutions -----------------------------------------------------------------------------------------------

def load_inline_arguments(source: str) -> dict:
    """The literal arguments of the program's load_inline call (names resolved to module-level string constants)."""
    tree = ast.parse(source)
    constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "load_inline")
    args = {}
    for kw in call.keywords:
        value = constants.get(kw.value.id, kw.value) if isinstance(kw.value, ast.Name) else kw.value
        args[kw.arg] = ast.literal_eval(value)
    return args


def test_every_builtin_task_has_correct_and_wrong_solutions_in_kernelbench_form():
    solutions = builtin_solutions()
    tasks = {t.task_id for t in load_builtin_tasks().tasks}
    assert {s.task_id for s in solutions if s.kind == "correct"} == tasks
    assert {s.task_id for s in solutions if s.kind == "wrong"} == tasks
    names = set()
    for s in solutions:
        tree = ast.parse(s.source)
        assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body), s.path
        args = load_inline_arguments(s.source)
        assert "__global__" in args["cuda_sources"], s.path
        names.add(args["name"])
        assert (s.kind == "wrong") == ("BUG" in s.source), s.path
    assert len(names) == len(solutions)  # distinct extension names


def combined_translation_unit(programs: dict[str, str]) -> str:
    """All programs' CUDA sources in one .cu, each in its own namespace; taking the address of every bound function
    is ambiguous (a compile error) if its cpp_sources declaration does not match the definition."""
    parts = ["#include <torch/extension.h>\n"]
    for i, (label, source) in enumerate(programs.items()):
        args = load_inline_arguments(source)
        cpp = args["cpp_sources"] if isinstance(args["cpp_sources"], str) else "\n".join(args["cpp_sources"])
        cuda = args["cuda_sources"] if isinstance(args["cuda_sources"], str) else "\n".join(args["cuda_sources"])
        checks = "\n".join(f"static auto check_{f} = &{f};" for f in args["functions"])
        parts.append(f"// {label}\nnamespace solution_{i} {{\n{cuda}\n{cpp}\n{checks}\n}}\n")
    return "\n".join(parts)


@pytest.mark.nvcc
@pytest.mark.slow
def test_all_builtin_solutions_and_the_one_shot_example_compile_with_nvcc(tmp_path):
    import torch
    from torch.utils.cpp_extension import include_paths

    python_include = sysconfig.get_paths()["include"]
    if not (Path(python_include) / "Python.h").exists():
        pytest.skip(f"no Python headers in {python_include} (torch/extension.h needs Python.h)")
    programs = {s.path: s.source for s in builtin_solutions()}
    programs["one_shot"] = one_shot.EXAMPLE_MODEL_NEW
    cu = tmp_path / "all_solutions.cu"
    cu.write_text(combined_translation_unit(programs))
    cmd = ["nvcc", "-c", str(cu), "-o", str(tmp_path / "all.o"), "-arch=sm_90", "-std=c++17", "-O1",
           "-DTORCH_EXTENSION_NAME=builtin_solutions", "-DTORCH_API_INCLUDE_EXTENSION_H",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-Xcompiler", "-fPIC",
           "-w"] + [f"-I{p}" for p in include_paths() + [python_include]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-5000:]


@pytest.mark.nvcc
def test_nvcc_rejects_a_mismatched_declaration(tmp_path):
    """The declaration check of the combined unit is real: a declaration that differs from the definition makes the
    address-of ambiguous, a compile error (no torch headers here, so this one is quick)."""
    cu = tmp_path / "mismatch.cu"
    cu.write_text("namespace s {\ninline int f(double x) { return 1; }\nint f(float x);\n"
                  "static auto check_f = &f;\n}\n")
    out = subprocess.run(["nvcc", "-c", str(cu), "-o", str(tmp_path / "m.o"), "-arch=sm_90"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0 and "check_f" in out.stderr
    cu.write_text(cu.read_text().replace("int f(float x);", "int f(double x);"))
    out = subprocess.run(["nvcc", "-c", str(cu), "-o", str(tmp_path / "m.o"), "-arch=sm_90"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
