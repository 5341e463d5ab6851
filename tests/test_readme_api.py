"""The README's "Python API" section runs as written: its ```python blocks are
executed in order, in one fresh interpreter, in an empty folder."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def api_blocks() -> list[str]:
    text = README.read_text()
    m = re.search(r"^## Python API\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README has no '## Python API' section"
    return re.findall(r"^```python\n(.*?)^```", m.group(1), re.S | re.M)


def test_readme_python_api_blocks_run(tmp_path):
    blocks = api_blocks()
    assert len(blocks) >= 3
    script = "\n".join(f"# ---- block {i + 1}\n{b}" for i, b in enumerate(blocks))
    (tmp_path / "readme_api.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), SPRINT_DEVICE="cpu")
    r = subprocess.run([sys.executable, "readme_api.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README Python API failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    out = r.stdout
    # each block printed what it says it prints
    assert len(re.findall(r"test accuracy \d+\.\d %", out)) == 3, out
    assert re.search(r"^Net\('digits', input 1x8x8", out, re.M), out
    assert re.search(r"predicted \[[\d ]+\] true \[[\d ]+\]", out), out
    assert "T_Epoch" in out and (tmp_path / "runs" / "api" / "checkpoint.npz").exists()
