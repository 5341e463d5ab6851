"""The fuzz of bench/fuzz.py in CI: a few thousand calls of every engine.ops
function (on the CPU, and on the GPU path with the CUDA sources run on the
CPU), every raw binding (engine._sprint_cpu, and engine._sprint_cuda when it
is built and no device is present) with random dtypes, shapes,
strides, huge and negative sizes, empty arrays, non-contiguous, read-only and
aliased arrays, NaN/Inf. Every call must succeed with results of the right
shapes and no write outside its arrays, or raise TypeError/ValueError/
OverflowError/MemoryError: no crash, no hang (the calls run in child
processes with faulthandler). The long run: python bench/fuzz.py --calls 100000."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import fuzz  # noqa: E402  (bench/fuzz.py)


def _report(rep) -> str:
    lines = [f"{f['kind']} at call {f['index']}: {f.get('call')}\n    {f.get('detail') or f.get('stderr', '')[:800]}"
             for f in rep["failures"][:10]]
    return "\n".join(lines)


@pytest.mark.parametrize("seed", [2026])
def test_fuzz_every_op_and_binding(seed):
    rep = fuzz.fuzz(4000, seed=seed, batch=1000, time_limit=20.0)
    assert rep["calls"] == 4000
    assert (rep["crashes"], rep["hangs"], rep["bad"]) == (0, 0, 0), _report(rep)
    assert rep["generator_error"] <= 5, rep
    # the generator reaches past argument checking everywhere: each op and
    # each CPU binding has calls that succeeded
    from fuzz_targets import CPU_VALID
    for name, st in rep["by_target"].items():
        if name.startswith(("ops.", "emu.")) or name[4:] in CPU_VALID and name.startswith("cpu."):
            assert st["ok"] > 0, f"the fuzz never made a valid call of {name}: {st}"
    assert sum(n.startswith("ops.") for n in rep["by_target"]) >= 20


def test_the_fuzzer_catches_crashes_hangs_and_stray_exceptions():
    """Targets that segfault, abort, hang or raise KeyError on purpose: each
    is reported with its call, and the run goes on after it."""
    rep = fuzz.fuzz(6, seed=11, batch=3, kinds=("selftest",), time_limit=1.0)  # seed 11 draws all four
    assert rep["calls"] == 6
    kinds = {}
    for f in rep["failures"]:
        kinds.setdefault(f["target"], set()).add(f["kind"])
        assert f["call"].startswith(f["target"] + "(")
    assert kinds == {"selftest.segfault": {"crash"}, "selftest.abort": {"crash"}, "selftest.hang": {"hang"},
                     "selftest.bad_exception": {"bad"}}, kinds
    assert rep["crashes"] + rep["hangs"] + rep["bad"] == 6


def test_calls_replay_from_seed_and_index():
    ts, _ = fuzz.targets(("ops", "cpu"))
    a = fuzz.generate(ts, 5, 123)
    b = fuzz.generate(ts, 5, 123)
    assert fuzz.describe_call(*a[:3]) == fuzz.describe_call(*b[:3])


def test_set_num_threads_validates():
    from engine import _sprint_cpu as m
    for bad in (0, -1, 1 << 40):
        with pytest.raises((ValueError, TypeError)):
            m.set_num_threads(bad)


def test_every_op_module_function_is_exported_and_fuzzed():
    """engine/ops/__init__.py lists the ops by hand; a function a family module
    exports but the package does not would escape the fuzz."""
    import importlib
    import pkgutil

    import engine.ops as ops
    for info in pkgutil.iter_modules(ops.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"engine.ops.{info.name}")
        for name in getattr(mod, "__all__", ()):  # conv.py and gemm.py have none: listed by hand
            assert name in ops.__all__ and getattr(ops, name) is getattr(mod, name), f"engine.ops misses {name}"
    ts, _ = fuzz.targets(("ops",))
    assert {t.name for t in ts} == {f"ops.{n}" for n in ops.__all__}
