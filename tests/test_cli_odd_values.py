"""Odd values a newcomer types, each one error line naming its option or
file, found probing README's commands: a profile output under a folder no
file can be made in (root passes os.access there) was found out only after
the sweep's minutes; a negative selfcheck seed came out of numpy as
'expected non-negative integer', naming no option."""
import os

import pytest

from engine import cli


def _one_error(capsys, *fragments):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sprint: error: "), err
    for f in fragments:
        assert f in err[0], err[0]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_profile_that_cannot_be_written_is_refused_before_the_sweep(capsys, monkeypatch):
    from engine.perf import sweep

    def swept(*a, **kw):
        raise AssertionError("the sweep started")
    monkeypatch.setattr(sweep, "run_all", swept)
    assert cli.main(["profile", "--quick", "--out", "/proc/sprint-profile.json"]) == 2
    _one_error(capsys, "cannot write into this folder", "(/proc)")
    assert cli.main(["profile", "--quick", "--records", "/proc/self/sprint-records.json"]) == 2
    _one_error(capsys, "cannot write into this folder", "(/proc/self)")


def test_a_negative_selfcheck_seed_names_its_option(capsys):
    assert cli.main(["selfcheck", "--seed", "-1"]) == 2
    _one_error(capsys, "must be an integer >= 0, got -1", "(--seed)")
