"""The Python API as a user meets it: what ``import engine`` shows, the forms
``Net`` accepts, the performance model's default profile, docstrings and reprs."""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import engine
from engine.spec import NetSpec

SMALL = {"x0": 8, "m0": 1, "c": 3, "convs": [[4, 2]], "fcs": [12, 10]}


def test_import_is_light_and_dir_lists_every_export():
    code = ("import sys, engine; heavy = [m for m in ('numpy', 'engine.net', 'engine.ops', 'engine.parallel') "
            "if m in sys.modules]; print(heavy); print(sorted(dir(engine)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))).stdout.splitlines()
    assert out[0] == "[]"                       # import engine loads none of them
    shown = eval(out[1])
    assert set(engine.__all__) <= set(shown)
    assert not [n for n in shown if not n.startswith("__") and n not in engine.__all__]
    for name in engine.__all__:
        assert getattr(engine, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nett'"):
        engine.Nett


def test_net_accepts_a_preset_a_dict_a_file_and_a_netspec(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    spec = NetSpec.from_dict(SMALL)
    nets = [engine.Net(m, seed=3) for m in (SMALL, str(path), path, spec)]
    for n in nets:
        assert n.spec.to_dict() | {"name": ""} == spec.to_dict() | {"name": ""}
        np.testing.assert_array_equal(n.params, nets[0].params)   # same seed, same layout
    assert engine.Net("digits").spec == engine.get_spec("digits")
    with pytest.raises(ValueError, match="missing"):
        engine.Net({"x0": 8})
    with pytest.raises(ValueError, match="neither a preset"):
        engine.Net("no-such-net")


def test_net_and_sgd_reprs_are_one_short_line():
    net = engine.Net(SMALL)
    opt = engine.SGD(net, lr=0.1, momentum=0.5)
    for r in (repr(net), repr(opt)):
        assert "\n" not in r and len(r) < 160, r
    assert "input 1x8x8" in repr(net) and f"{net.n_params:,}" in repr(net)
    assert "lr=0.1" in repr(opt) and "momentum=0.5" in repr(opt)


def test_predict_uses_the_shipped_profile_by_default(tmp_path):
    from engine.perf import Profile, predict
    shipped = Profile.load()
    ref = predict("digits", 2, 1, 8, shipped)
    for profile in (None, tmp_path / "p.json"):
        if profile is not None:
            shipped.save(profile)
        got = predict("digits", 2, 1, 8, profile)
        assert (got.t_epoch, got.n_minibatch_avg, got.staleness) == (ref.t_epoch, ref.n_minibatch_avg,
                                                                    ref.staleness)
    assert ref.t_epoch > 0
    with pytest.raises(FileNotFoundError):
        predict("digits", 2, 1, 8, str(tmp_path / "missing.json"))


def _public_members(obj):
    for name, member in vars(obj).items():
        if name.startswith("_"):
            continue
        f = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(f):
            yield name, f


def _documented(obj) -> bool:
    doc = (obj.__doc__ or "").strip()
    # a dataclass without a docstring gets its signature as __doc__
    auto = dataclasses.is_dataclass(obj) and doc.startswith(obj.__name__ + "(")
    return bool(doc) and not auto


def test_every_public_name_has_a_docstring():
    missing = []
    names = [getattr(engine, n) for n in engine.__all__] + [engine.parallel.run, engine.perf.predict]
    for obj in names:
        if inspect.ismodule(obj):
            if not _documented(obj):
                missing.append(obj.__name__)
            continue
        if not _documented(obj):
            missing.append(obj.__qualname__)
        if inspect.isclass(obj):
            missing += [f"{obj.__name__}.{n}" for n, f in _public_members(obj) if not _documented(f)]
    assert not missing, f"no docstring: {missing}"
