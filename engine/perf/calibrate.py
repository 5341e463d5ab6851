"""Is this profile about this machine? Its fingerprint and a short calibration.

``sprint profile`` stores in the profile the machine it measured (CPU model,
cores, memory, the Python/numpy/BLAS it ran) and the time of a fixed,
one-thread calibration workload (``calibration_step``). Before
``predict``/``tune``/``simulate`` use a profile, ``check`` runs the same
workload for a couple of seconds: when the fingerprint differs, or the
workload runs slower or faster than the stored time by more than the noise
of the two measurements, it says so and rescales the profile's times by
the measured ratio (``Profile.time_scale``). A profile without a fingerprint
(written before this check existed) is reported as unverifiable.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field

import numpy as np

# Fingerprint fields whose difference means "another machine or software":
# each changes kernel times by itself.
FINGERPRINT_KEYS = ("cpu_model", "cores", "mem_gib", "python", "numpy", "blas", "backend")
# Below this relative difference two calibrations of one machine are not
# told apart (shared 2-core VM: runs of one configuration spread by 5-8 %).
MIN_NOISE = 0.10


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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


def _same(key, a, b) -> bool:
    # Profiles written before the BLAS was read from NumPy's build list the
    # loaded .so files: not comparable with a name and version, so not told apart.
    if key == "blas" and (".so" in str(a)) != (".so" in str(b)):
        return True
    return a == b


def fingerprint() -> dict:
    """What this machine and its software are, in the fields a profile keeps."""
    from engine import backend
    be = backend.get_backend().name
    return {"cpu_model": _cpu_model(), "cores": _cores(), "mem_gib": _mem_gib(),
            "python": platform.python_version(), "numpy": np.__version__, "blas": _blas(), "backend": be,
            "host": platform.node()}


def _workload():
    """One call of the fixed calibration workload: a mid-size SGEMM, a flat
    copy larger than L2, and a step of the ``tiny`` net -- the three kinds
    of cost the model prices (flops, memory, per-call Python)."""
    from engine import ops
    from engine.net import Net
    from engine.spec import get_spec
    rng = np.random.default_rng(0)
    a = rng.standard_normal((192, 192)).astype(np.float32)
    b = rng.standard_normal((192, 192)).astype(np.float32)
    c = np.empty((192, 192), np.float32)
    src = rng.standard_normal(1 << 20).astype(np.float32)
    dst = np.empty_like(src)
    sp = get_spec("tiny")
    net = Net(sp, seed=0)
    x = rng.standard_normal((8,) + sp.input_shape).astype(np.float32)
    y = rng.integers(0, sp.n_classes, 8)

    def run():
        ops.gemm(a, b, out=c)
        np.copyto(dst, src)
        net.loss_and_grad(x, y)
    return run


def calibration_step(seconds: float = 2.0, blocks: int = 5) -> dict:
    """Wall and CPU seconds per call of the calibration workload on one
    thread, run for ``seconds``.

    ``wall_s`` is throughput (elapsed / calls), not a median: on a shared
    host most calls fit in one scheduler slice and a few wait for whole
    slices, and a long run pays for both. ``u``: relative uncertainty of
    ``wall_s``, from the spread of its ``blocks`` consecutive blocks.
    """
    from .timing import set_threads
    set_threads(1)
    fn = _workload()
    for _ in range(3):
        fn()
    per_block = seconds / blocks
    walls, cpus, n = [], [], 0
    for _ in range(blocks):
        calls, t0, c0 = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - t0 < per_block or calls < 2:
            fn()
            calls += 1
        walls.append((time.perf_counter() - t0) / calls)
        cpus.append((time.thread_time() - c0) / calls)
        n += calls
    w = float(np.mean(walls))
    return {"wall_s": w, "cpu_s": float(np.mean(cpus)),
            "u": float(np.std(walls, ddof=1) / w / np.sqrt(blocks)), "n": n,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def record(seconds: float = 2.0) -> dict:
    """The fingerprint with a calibration: what ``sprint profile`` stores."""
    fp = fingerprint()
    fp["calibration"] = calibration_step(seconds)
    return fp


@dataclass
class Check:
    """Result of comparing this machine with a profile's."""
    scale: float = 1.0                 # times to multiply the profile's times by
    messages: list = field(default_factory=list)
    differs: dict = field(default_factory=dict)    # fingerprint key -> (profile's, this machine's)
    ratio: float | None = None         # calibration now / then (wall clock)
    noise: float = MIN_NOISE

    @property
    def ok(self) -> bool:
        return not self.messages


def compare(stored: dict | None, now: dict | None, calibration: dict | None, source: str = "profile") -> Check:
    """Compare a profile's ``stored`` fingerprint with this machine's ``now``
    and a fresh ``calibration``; ``scale`` is the calibration ratio when it
    differs by more than the noise."""
    chk = Check()
    if not stored:
        chk.messages.append(f"{source} records no machine fingerprint or calibration (written before "
                            "profiles carried one): it cannot be checked against this machine; run "
                            "`sprint profile --quick` for a profile of this one")
        return chk
    if now:
        chk.differs = {k: (stored.get(k), now.get(k)) for k in FINGERPRINT_KEYS
                       if k in stored and not _same(k, stored.get(k), now.get(k))}
        if chk.differs:
            what = "; ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in chk.differs.items())
            chk.messages.append(f"{source} was measured on another machine or software ({what}); "
                                "run `sprint profile --quick` for a profile of this one")
    then = stored.get("calibration")
    if calibration and then and then.get("wall_s") and calibration.get("wall_s"):
        ratio = calibration["wall_s"] / then["wall_s"]
        # The two measurements' uncertainties, combined, three sigma.
        sd = np.hypot(then.get("u", 0.0), calibration.get("u", 0.0))
        # The profile's own drift between its before and after calibrations
        # is noise of the same machine too.
        chk.noise = max(MIN_NOISE, 3.0 * float(sd), float(then.get("drift", 0.0)))
        chk.ratio = float(ratio)
        if abs(ratio - 1.0) > chk.noise:
            chk.scale = float(ratio)
            cpu = calibration.get("cpu_s", 0) / then["cpu_s"] if then.get("cpu_s") else None
            why = "" if cpu is None else (
                f"; CPU time x{cpu:.2f}, so " + ("the cores themselves are slower or faster"
                                                 if abs(cpu - 1) > chk.noise else "other jobs load the host"))
            chk.messages.append(
                f"this machine runs the calibration workload in {ratio:.2f}x the time stored in {source} "
                f"({1e3 * calibration['wall_s']:.2f} ms now, {1e3 * then['wall_s']:.2f} ms on "
                f"{then.get('date', '?')}, noise +-{100 * chk.noise:.0f} %{why}): every time is rescaled "
                f"by x{ratio:.2f}; `sprint profile --quick` measures this machine as it is now")
    elif calibration is not None:
        chk.messages.append(f"{source} has no calibration time: its speed cannot be checked against this "
                            "machine's; run `sprint profile --quick`")
    return chk


def check(profile, seconds: float = 2.0, apply: bool = True) -> Check:
    """Calibrate now (``seconds``), compare with ``profile``'s machine and,
    with ``apply``, rescale it (``profile.time_scale``)."""
    stored = profile.data.get("fingerprint")
    if profile.data.get("backend", "cpu") != "cpu":
        # A GPU profile's times are the device's: a CPU workload says nothing about it.
        chk = compare(stored, fingerprint(), None, profile.source)
    else:
        chk = compare(stored, fingerprint(), calibration_step(seconds) if stored else None, profile.source)
    if apply and chk.scale != 1.0:
        profile.time_scale = chk.scale
    return chk
