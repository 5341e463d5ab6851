"""The perf PNGs (`sprint profile --plots`, bench/validate_model.py --plot)
are written like every other file of the engine: whole or not at all."""
import errno
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from engine.perf import plots

ROWS = [{"model": "tiny", "measured": {"T_GPU": 0.01 * (i + 1), "staleness": 1.0 + i},
         "predicted": {"T_GPU": 0.012 * (i + 1), "staleness": 1.1 + i}} for i in range(3)]


def test_a_plot_is_written_whole(tmp_path):
    path = plots.plot_validation(ROWS, tmp_path / "sub" / "v.png")
    assert path == tmp_path / "sub" / "v.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["v.png"]


def test_a_failed_write_leaves_the_previous_plot_and_no_temporary(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    old = tmp_path / "v.png"
    old.write_bytes(b"the previous plot")

    def disk_full(self, fname, **kw):
        f = open(fname, "wb") if isinstance(fname, (str, Path)) else fname
        f.write(b"half a PNG")
        f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", disk_full)
    with pytest.raises(OSError) as e:
        plots.plot_validation(ROWS, old)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(old)
    assert old.read_bytes() == b"the previous plot"
    assert [p.name for p in tmp_path.iterdir()] == ["v.png"]
