"""The README's "Python API" section runs as written: its ```python blocks are
executed in order, in one fresh interpreter, in an empty folder. And what it
tells a newcomer before that holds: the install's dependencies, the output of
the stand-in data writers."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_readme_names_every_dependency_the_install_brings():
    """README's list of what the install needs from PyPI left out SciPy,
    which `pip install -e .` installs (the performance model's fits)."""
    import tomllib
    deps = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    said = re.search(r"Both need only PyPI \(([^;]*);", README.read_text().replace("\n", " "))
    assert said, "README no longer says what the install needs from PyPI"
    for dep in deps:
        name = re.match(r"[A-Za-z0-9_.-]+", dep).group(0)
        assert name.lower() in said.group(1).lower(), (name, said.group(1))


@pytest.mark.parametrize("script, fmt", [("cifar_like.py", "cifar"), ("mnist_like.py", "mnist")])
def test_the_stand_in_writers_say_what_they_wrote_and_how_to_train_on_it(tmp_path, script, fmt):
    """`python tests/cifar_like.py DIR` (README) printed a bare '(1438, 359)'."""
    out = tmp_path / "DIR"
    p = subprocess.run([sys.executable, str(README.parent / "tests" / script), str(out)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(README.parent)))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout == (f"wrote 1,438 train / 359 test images in {out} "
                        f"(train on them: sprint train --model {fmt} --data {out} --format {fmt})\n")
