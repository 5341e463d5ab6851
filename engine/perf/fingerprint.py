"""What machine and software a profile was measured on: the fingerprint
``sprint profile`` stores and ``calibrate.check`` compares with this
machine's before each prediction (``differing``)."""
from __future__ import annotations

import os
import platform

import numpy as np

from engine.parallel.threads import usable_cores

# Fingerprint fields whose difference means "another machine or software":
# each changes kernel times by itself. The cache sizes tell apart CPUs that
# a VM names alike: the "Intel(R) Xeon(R) Processor" of 2026-12-02 had a
# 480 MiB L3, the one of 2026-12-06 (same name, model and flags) 300 MiB,
# and ran the calibration twice as long (bench/RESULTS.md section 4, set 23).
# A profile written before a key was kept is not compared on it.
FINGERPRINT_KEYS = ("cpu_model", "cores", "mem_gib", "l2_bytes", "llc_bytes", "python", "numpy", "blas", "backend")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_bytes(level, default=None):
    """Size of cpu0's unified (or data) cache of ``level`` from sysfs; ``default`` if unknown."""
    import glob
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            if int(open(f"{d}/level").read()) != level or open(f"{d}/type").read().strip() == "Instruction":
                continue
            txt = open(f"{d}/size").read().strip()
            return int(txt[:-1]) * {"K": 1 << 10, "M": 1 << 20}[txt[-1]]
        except (OSError, ValueError, KeyError):
            continue
    return default


def _mem_gib() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError, AttributeError):
        return 0.0


def _blas() -> str:
    """The BLAS NumPy was built against, name and version. Not the libraries
    loaded in this process: which of those are there depends on what was
    imported first (SciPy brings its own OpenBLAS), so the same machine gave
    two fingerprints."""
    try:
        b = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{b.get('name', '?')} {b.get('version', '?')}"
    except Exception:       # numpy < 1.26 has no mode="dicts"
        from engine.parallel.threads import _loaded_libs
        libs = [p for p in _loaded_libs("openblas") if "numpy" in p]
        return ",".join(sorted(os.path.basename(p) for p in libs)) or "unknown"


# The memory the kernel reports moves by a few MiB with its version and
# reservations, and 0.1 GiB rounding turns that into a "difference" (23.5
# and 23.6 GiB on the two 24-GiB Xeon VMs of 2026-12-02 and 12-06, which
# their L3 sizes tell apart). Memory this close changes no kernel's time: it
# is not compared as a difference. A real change of memory is tens of percent.
MEM_SAME = 0.05


def _same(key, a, b) -> bool:
    # Profiles written before the BLAS was read from NumPy's build list the
    # loaded .so files: not comparable with a name and version, so not told apart.
    if key == "blas" and (".so" in str(a)) != (".so" in str(b)):
        return True
    if key == "mem_gib" and isinstance(a, (int, float)) and isinstance(b, (int, float)):
        # 0.0: not read (_mem_gib), so not compared, as a key a profile did not keep
        return min(a, b) <= 0 or abs(a - b) <= MEM_SAME * max(a, b)
    return a == b


def differing(stored: dict, now: dict) -> dict:
    """The fingerprint keys on which ``stored`` (a profile's) and ``now``
    differ: key -> (stored value, this machine's)."""
    return {k: (stored.get(k), now.get(k)) for k in FINGERPRINT_KEYS
            if k in stored and not _same(k, stored.get(k), now.get(k))}


def fingerprint() -> dict:
    """What this machine and its software are, in the fields a profile keeps."""
    from engine import backend
    be = backend.get_backend().name
    return {"cpu_model": _cpu_model(), "cores": usable_cores(), "mem_gib": _mem_gib(),
            "l2_bytes": cache_bytes(2), "llc_bytes": cache_bytes(3),
            "python": platform.python_version(), "numpy": np.__version__, "blas": _blas(), "backend": be,
            "host": platform.node()}


# The keys that make a profile "of this machine" for ``profiles_here``: the
# hardware (software versions move the kernels less than a CPU does).
MACHINE_KEYS = ("cpu_model", "cores", "l2_bytes", "llc_bytes")


def profiles_here(now: dict, folder=None) -> list:
    """[(sweep date, path)] of the profile files in ``folder`` (the
    checkout's bench/profiles by default) measured on this machine's
    hardware (the ``MACHINE_KEYS`` this machine reports, equal), newest sweep first:
    what to name when the profile in use is another machine's."""
    import json
    from .profile import checkout_profiles
    keys = [k for k in MACHINE_KEYS if k in now] if "cpu_model" in now else []
    out = []
    for f in checkout_profiles(folder):
        try:
            fp = json.loads(f.read_text()).get("fingerprint") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if keys and all(k in fp and fp[k] == now[k] for k in keys):
            out.append(((fp.get("calibration") or {}).get("date", ""), f))
    return sorted(out, key=lambda p: p[0], reverse=True)
