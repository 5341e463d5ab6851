"""`sprint selfcheck` checks every op of engine.ops it claims: each public op
is covered by a check (or listed as a helper that launches no kernel), and a
wrong result from any one op makes its check fail."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from engine import backend, ops, selfcheck

OPS = sorted(set(ops.__all__) - set(selfcheck.HELPERS))


@pytest.fixture(autouse=True)
def _cpu():
    backend.set_backend("cpu")


def test_cli_checks_every_op_and_says_so():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-m", "engine.cli", "selfcheck"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every op of engine.ops checked" in r.stdout
    for label, _, _ in selfcheck.checks(np.random.default_rng(0)):
        assert any(line.startswith(label) and line.rstrip().endswith("ok") for line in r.stdout.splitlines()), label


def test_coverage_names_no_unchecked_op_and_no_stale_helper():
    runnable, unchecked = selfcheck.coverage()
    assert unchecked == []
    assert set(selfcheck.HELPERS) <= set(ops.__all__)
    assert len(runnable) == len(selfcheck.checks(np.random.default_rng(0)))


def test_an_op_without_a_check_is_named(monkeypatch, capsys):
    monkeypatch.setattr(ops, "__all__", list(ops.__all__) + ["new_kernel"])
    monkeypatch.setattr(ops, "new_kernel", lambda x: x, raising=False)
    assert selfcheck.run("cpu") == 0
    assert "NOT checked: new_kernel" in capsys.readouterr().out


def _perturbed(fn):
    def wrong(*args, **kw):
        out = fn(*args, **kw)
        first = out[0] if isinstance(out, tuple) else out
        if isinstance(first, np.ndarray):
            first += np.float32(1e-2) * (1 + np.abs(first).max(initial=0))   # in place: in-place ops too
            return out
        return (first * 1.01 + 1e-2,) + tuple(out[1:])                         # a scalar (the loss)
    return wrong


@pytest.mark.parametrize("name", OPS)
def test_a_wrong_result_from_any_op_fails_its_check(name, monkeypatch, capsys):
    monkeypatch.setattr(ops, name, _perturbed(getattr(ops, name)))
    assert selfcheck.run("cpu") == 1
    out = capsys.readouterr().out
    label = next(lbl for lbl, _, covers in selfcheck.checks(np.random.default_rng(0)) if name in covers)
    row = next(line for line in out.splitlines() if line.startswith(label))
    assert "FAIL" in row, out
