"""benchmarks/timing_under_load.py --shard / --from-json a,b: the shards of a split run join into one (the items'
records together, the load programs' apart per shard) and files that are not distinct shards are refused."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("timing_under_load", REPO / "benchmarks" / "timing_under_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module           # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


tul = _module()


def _shard(k: int, items: list[str], floor):
    rec = {i: {"correct": True, "cand_ms": 0.1 * (k + 1)} for i in items}
    return {"args": {"skip_idle": False, "compile_workers": 16}, "shard": [k, 2], "total_wall_s": 100.0 + k,
            "device_name": "NVIDIA H100 80GB HBM3", "empty_forward": floor,
            "set": [{"id": i, "source": "bench", "task_id": i} for i in items],
            "scenarios": {"idle": {"n": len(items), "wall_s": 10.0, "startup_s": 1.0}},
            "records": {"idle": rec, "load": rec, "warm": rec, "load_programs_load": {"load/0": {"correct": True}},
                        "load_programs_warm": {"load/0": {"correct": True}}}}


def test_shards_join_into_one_run():
    merged = tul.merge_shards([_shard(0, ["a", "c"], None), _shard(1, ["b", "d"], {"evaluator_us": 5.0})])
    assert [x["id"] for x in merged["set"]] == ["a", "c", "b", "d"] and merged["set_n"] == 4
    assert set(merged["records"]["idle"]) == {"a", "b", "c", "d"}
    assert merged["records"]["idle"]["b"]["cand_ms"] == pytest.approx(0.2)
    # the load programs have the same names in every shard: kept apart, none lost
    assert set(merged["records"]["load_programs_load"]) == {"shard0:load/0", "shard1:load/0"}
    assert merged["empty_forward"] == {"evaluator_us": 5.0}
    assert merged["total_wall_s"] == 101.0 and "2 shards side by side" in merged["device_name"]
    assert set(merged["scenarios"]) == {"idle (shard 0)", "idle (shard 1)"}


def test_files_that_are_not_distinct_shards_are_refused():
    with pytest.raises(SystemExit, match="not distinct shards"):
        tul.merge_shards([_shard(0, ["a"], None), _shard(0, ["b"], None)])
    with pytest.raises(SystemExit, match="appears in two"):
        tul.merge_shards([_shard(0, ["a"], None), _shard(1, ["a"], None)])
