"""``sprint`` on the emulated GPU (tests/gpu_emu.py): installs the stand-in
``cupy`` before the engine is imported, then runs the engine's command line
with the given arguments. Under mpiexec every rank does the same:

    mpiexec -n K python -m mpi4py tests/gpu_boot.py train --device gpu --parallel pipeline ...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_emu  # noqa: E402

gpu_emu.install()

from engine.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
