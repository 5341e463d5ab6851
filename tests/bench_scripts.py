"""A bench/ script loaded as a module, for the tests of its functions
(bench/ is not a package: its scripts are run by path)."""
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name):
    """bench/<name>.py, executed once per call as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
