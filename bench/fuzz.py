"""Fuzz every engine.ops function and every raw binding (engine._sprint_cpu,
engine._sprint_cuda when no device is present): each call must succeed with
results of the right shapes, writing only inside its arrays, or raise
TypeError/ValueError/OverflowError/MemoryError (RuntimeError naming a CUDA
error for the CUDA launchers) -- never crash, never hang.

Calls run in batches in child processes (faulthandler on, address space
capped so a runaway allocation is a MemoryError): a crash or a hang (a call
over --time-limit seconds) ends its child, is recorded with the failing call,
and the next child resumes after it. Call k of --seed s is generated from
(s, k) alone: `--replay k` runs it again in this process and prints it.

    python bench/fuzz.py --calls 100000 --seed 1         # the long run
    python bench/fuzz.py --seed 1 --replay 4711          # one call again
tests/test_fuzz_bindings.py runs a few thousand calls of the same fuzzer."""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_ops import result_shapes  # noqa: E402
from fuzz_targets import DTYPES, HUGE, Arrays, CudaError, huge_empty, targets  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# ---- call generation ---------------------------------------------------------

def random_array(rng, A, pool=(0, 1, 2, 3)):
    ndim = int(rng.integers(0, 6))
    if rng.random() < 0.05:  # empty, with huge dimensions
        shape = [0] + [int(rng.choice([1 << 20, 1 << 40, 1 << 58, 3])) for _ in range(max(ndim, 1) - 1)]
        rng.shuffle(shape)
        return huge_empty(shape)
    shape = [int(rng.choice(pool)) for _ in range(ndim)]
    dtype = np.float32 if rng.random() < 0.75 else DTYPES[int(rng.integers(len(DTYPES)))]
    return A.new(shape, dtype, contiguous=rng.random() > 0.1 or not ndim, writable=rng.random() > 0.05)


def random_int(rng):
    r = rng.random()
    if r < 0.6:
        return int(rng.integers(-1, 5))
    if r < 0.9:
        return int(rng.choice(HUGE))
    return [2.5, "3", None, True, np.int64(2), np.uint64(1 << 63), float("nan")][int(rng.integers(7))]


def random_value(kind, rng, A):
    r = rng.random()
    if kind == "int":
        return random_int(rng)
    if kind == "float":
        return [0.5, -1.0, 0.0, float("nan"), float("inf"), 1e39, 1e30, "x", None, True][int(rng.integers(10))]
    if kind == "bool":
        return [True, False, 0, 1, None, "yes", np.bool_(True)][int(rng.integers(7))] if r < 0.3 else bool(r < 0.65)
    if kind == "seq":
        return [random_array(rng, A, (2,)) for _ in range(int(rng.integers(0, 4)))]
    if kind == "shape":
        n = 4 if r < 0.8 else int(rng.integers(0, 6))
        return tuple(random_int(rng) if rng.random() < 0.3 else int(rng.integers(1, 4)) for _ in range(n))
    if kind == "pair":
        return random_int(rng) if r < 0.5 else (random_int(rng), random_int(rng))
    if r < 0.05:
        return None if kind != "any" else random_array(rng, A)
    return random_array(rng, A)


def mutate_array(a, rng, A, others):
    op = int(rng.integers(11))
    shape = list(a.shape)
    if op == 0 and shape:       # one dimension off (or zero)
        i = int(rng.integers(len(shape)))
        shape[i] = int(rng.choice([shape[i] + 1, max(0, shape[i] - 1), 0]))
        if a.size == 0 and np.prod(shape, dtype=object) > 1 << 20:
            return huge_empty([0] + shape[1:], a.dtype)
        return A.new(shape, a.dtype)
    if op == 1:                 # rank change
        return A.new(shape[1:] if shape and rng.random() < 0.5 else [1] + shape, a.dtype)
    if op == 2:                 # dtype change
        with np.errstate(all="ignore"):
            return A.like(a.astype(DTYPES[int(rng.integers(len(DTYPES)))]))
    if op == 3 and shape:       # non-contiguous view of the right shape
        b = A.new(shape, a.dtype, contiguous=False)
        if a.size:
            b[...] = a
        return b
    if op == 4:                 # read-only
        return A.like(a, writable=False)
    if op == 5 and a.size and a.dtype.kind in "iu":   # out-of-range index values
        b = A.like(a)
        b.flat[int(rng.integers(b.size))] = rng.choice([-1, np.iinfo(b.dtype).max, np.iinfo(b.dtype).min, 1 << 20])
        return b
    if op == 6 and a.size and a.dtype.kind == "f":    # NaN / Inf / huge values
        b = A.like(a)
        b.flat[int(rng.integers(b.size))] = rng.choice([np.nan, np.inf, -np.inf, -3e38, 0.0])
        return b
    if op == 7 and others:      # alias another argument (or a shifted view of it)
        o = others[int(rng.integers(len(others)))]
        return o[1:] if o.ndim and o.shape[0] > 1 and rng.random() < 0.5 else o
    if op == 8:                 # an empty array with huge dimensions
        return huge_empty([0] + [int(rng.choice([1 << 40, 1 << 20, 3]))] * max(0, a.ndim - 1), a.dtype)
    if op == 9:                 # not an array
        return [None, a.tolist() if a.size < 50 else 1.0, 3, "x"][int(rng.integers(4))]
    return A.like(a[::-1] if a.ndim else a)  # a reversed copy (valid; other values)


def mutate(v, kind, rng, A, others):
    if isinstance(v, np.ndarray):
        return mutate_array(v, rng, A, others)
    if isinstance(v, (bool, np.bool_)):
        return random_value("bool", rng, A)
    if isinstance(v, (int, np.integer)):
        return int(rng.choice([v + 1, v - 1, 0, -1, *HUGE])) if rng.random() < 0.8 else random_int(rng)
    if isinstance(v, float):
        return random_value("float", rng, A)
    if isinstance(v, (tuple, list)) and all(isinstance(e, (int, np.integer)) for e in v):
        if not v or rng.random() < 0.2:
            return tuple(v) + (1,) if rng.random() < 0.5 else tuple(v[1:])
        v = list(v)
        i = int(rng.integers(len(v)))
        v[i] = mutate(v[i], "int", rng, A, others)
        return tuple(v)
    if isinstance(v, list):  # a list of arrays
        r = rng.random()
        if v and r < 0.3:
            return v[:-1]
        if v and r < 0.6:
            i = int(rng.integers(len(v)))
            e = mutate_array(v[i], rng, A, others) if isinstance(v[i], np.ndarray) else random_array(rng, A, (2,))
            return v[:i] + [e] + v[i + 1:]
        return v + [random_array(rng, A, (2,))]
    if v is None and others and rng.random() < 0.5:
        return others[int(rng.integers(len(others)))]
    return random_value(kind, rng, A)


def make_call(t, rng, A):
    """(args, kwargs, mode) of one call of target t; mode valid|mutated|random."""
    made = t.valid(rng, A) if rng.random() < 0.6 else None
    if made is None:
        args = [random_value(kind, rng, A) for _, kind in t.kinds if kind != "skip"]
        if args and rng.random() < 0.03:
            args = args[:-1]  # wrong arity
        return args, {}, "random"
    args, kwargs = made
    names = [n for n, k in t.kinds if k != "skip"]
    n_mut = int(rng.choice([0, 1, 1, 1, 2, 3])) if names else 0
    for _ in range(n_mut):
        arrays = [a for a in list(args) + list(kwargs.values()) if isinstance(a, np.ndarray)]
        i = int(rng.integers(len(names)))
        kind = dict(t.kinds)[names[i]]
        if i < len(args):
            args[i] = mutate(args[i], kind, rng, A, arrays)
        else:
            kwargs[names[i]] = mutate(kwargs.get(names[i]), kind, rng, A, arrays)
    return args, kwargs, "mutated" if n_mut else "valid"


def describe(v) -> str:
    if isinstance(v, np.ndarray):
        flags = ("" if v.flags.c_contiguous else " non-contiguous") + ("" if v.flags.writeable else " read-only")
        return f"array({tuple(v.shape)}, {v.dtype}{flags})"
    if isinstance(v, list):
        return "[" + ", ".join(describe(e) for e in v) + "]"
    s = repr(v)
    return s if len(s) < 80 else s[:77] + "..."


def describe_call(t, args, kwargs) -> str:
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return f"{t.name}({', '.join(parts)})"


# ---- one call and its verdict -------------------------------------------------

def run_call(t, args, kwargs, A):
    """('ok' | 'rejected' | 'bad', detail)."""
    try:
        res = t.fn(*args, **kwargs)
    except t.errors as e:
        return "rejected", type(e).__name__
    except RuntimeError as e:
        if CudaError in t.errors and "CUDA error" in str(e):
            return "rejected", "CudaError"
        return "bad", f"RuntimeError: {e}"[:300]
    except Exception as e:  # noqa: BLE001 -- any other exception type is a finding
        return "bad", f"{type(e).__name__}: {e}"[:300]
    if not A.intact():
        return "bad", "wrote outside its arrays"
    if t.shape is not None:
        import inspect
        try:
            bound = inspect.signature(t.fn).bind(*args, **kwargs)
            bound.apply_defaults()
            want = t.shape(bound.arguments)
        except Exception as e:  # noqa: BLE001
            return "bad", f"accepted arguments its result rule cannot read ({type(e).__name__}: {e})"[:300]
        got = result_shapes(res)
        if [tuple(w) if isinstance(w, list) else w for w in want] != got:
            return "bad", f"result shapes {got}, expected {want}"
    return "ok", ""


def generate(ts, seed, k):
    rng = np.random.default_rng([seed, k])
    t = ts[int(rng.integers(len(ts)))]
    A = Arrays(rng)
    args, kwargs, mode = make_call(t, rng, A)
    return t, args, kwargs, mode, A


def worker(seed, first, last, kinds, time_limit, mem_gb):
    import resource
    if mem_gb > 0:
        lim = int(mem_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    faulthandler.enable()
    np.seterr(all="ignore")
    warnings.simplefilter("ignore")
    ts, _ = targets(kinds)
    for k in range(first, last):
        try:
            t, args, kwargs, mode, A = generate(ts, seed, k)
        except Exception as e:  # noqa: BLE001 -- a fuzzer bug: counted, not a finding
            print(f"B {k} generator - -\nE {k} generator_error 0 {type(e).__name__}: {e}", flush=True)
            continue
        print(f"B {k} {t.name} {mode} {describe_call(t, args, kwargs)}", flush=True)
        faulthandler.dump_traceback_later(time_limit, exit=True)
        t0 = time.perf_counter()
        verdict, detail = run_call(t, args, kwargs, A)
        dt = time.perf_counter() - t0
        faulthandler.cancel_dump_traceback_later()
        if verdict == "bad":
            detail = json.dumps({"detail": detail, "call": describe_call(t, args, kwargs)})
        print(f"E {k} {verdict} {dt:.4f} {detail}", flush=True)
    print("DONE", flush=True)


# ---- the supervisor -------------------------------------------------------------

def fuzz(calls, seed=0, batch=500, kinds=("ops", "cpu", "cuda", "emu"), time_limit=20.0, mem_gb=1.0,
         progress=None) -> dict:
    """Runs calls 0..calls-1 of `seed` in child processes; returns the report."""
    rep = {"seed": seed, "calls": 0, "ok": 0, "rejected": 0, "bad": 0, "crashes": 0, "hangs": 0, "generator_error": 0,
           "by_target": {}, "failures": [], "notes": targets(kinds)[1]}
    t0 = time.monotonic()
    k = 0
    slow = []
    while k < calls:
        last = min(calls, k + batch)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--seed", str(seed), "--first", str(k),
               "--last", str(last), "--targets", ",".join(kinds), "--time-limit", str(time_limit),
               "--mem-gb", str(mem_gb)]
        timed_out = False
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=4 * time_limit + 0.5 * (last - k) + 60,
                               env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(ROOT)})
            out, err, rc = r.stdout, r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            rc, timed_out = None, True
        begun, done = None, False
        for line in out.splitlines():
            parts = line.split(" ", 3)
            if parts[0] == "B":
                begun = (int(parts[1]), parts[2], parts[3].partition(" ")[2])
            elif parts[0] == "E":
                idx, verdict = int(parts[1]), parts[2]
                dt, _, rest = parts[3].partition(" ")
                slow.append((float(dt), idx, begun[2]))
                slow = sorted(slow, reverse=True)[:5]
                rep["calls"] += 1
                rep[verdict] += 1
                tgt = rep["by_target"].setdefault(begun[1], {"ok": 0, "rejected": 0, "bad": 0, "generator_error": 0})
                tgt[verdict] += 1
                if verdict == "bad":
                    rep["failures"].append({"index": idx, "kind": "bad", "target": begun[1], **json.loads(rest)})
                begun = None
            elif parts[0] == "DONE":
                done = True
        if done:
            k = last
        elif begun is None:  # died before its first call: nothing to attribute
            raise RuntimeError(f"fuzz worker failed to start (rc {rc}):\n{err[-3000:]}")
        else:
            hang = timed_out or "Timeout (" in err
            rep["calls"] += 1
            rep["hangs" if hang else "crashes"] += 1
            fatal = err[err.find("Fatal Python error"):] if "Fatal Python error" in err else err
            rep["failures"].append({"index": begun[0], "kind": "hang" if hang else "crash", "target": begun[1],
                                    "call": begun[2], "rc": rc, "stderr": fatal[:1500],
                                    "replay": f"python bench/fuzz.py --seed {seed} --replay {begun[0]}"})
            k = begun[0] + 1
        if progress:
            progress(rep, time.monotonic() - t0)
    rep["seconds"] = round(time.monotonic() - t0, 1)
    rep["slowest"] = [{"seconds": d, "index": i, "call": c} for d, i, c in slow]
    return rep


def replay(seed, k, kinds):
    faulthandler.enable()
    ts, _ = targets(kinds)
    t, args, kwargs, mode, A = generate(ts, seed, k)
    print(f"call {k} ({mode}): {describe_call(t, args, kwargs)}", flush=True)
    print(run_call(t, args, kwargs, A))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=1000, help="calls per child process")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds after which a call is a hang")
    ap.add_argument("--mem-gb", type=float, default=1.0,
                    help="address-space cap of the children (0: none); a call needing more is a MemoryError")
    ap.add_argument("--targets", default="ops,cpu,cuda,emu",
                    help="comma list of ops (engine.ops on the CPU), cpu (engine._sprint_cpu), cuda "
                         "(engine._sprint_cuda without a device), emu (engine.ops' GPU path with the CUDA "
                         "sources run on the CPU)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--replay", type=int, help="run call REPLAY of --seed in this process and print it")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--last", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    kinds = tuple(a.targets.split(","))
    if a.worker:
        worker(a.seed, a.first, a.last, kinds, a.time_limit, a.mem_gb)
        return 0
    if a.replay is not None:
        replay(a.seed, a.replay, kinds)
        return 0

    def progress(rep, dt):
        print(f"\r{rep['calls']} calls, {rep['crashes']} crashes, {rep['hangs']} hangs, {rep['bad']} bad, "
              f"{dt:.0f} s", end="", file=sys.stderr, flush=True)

    rep = fuzz(a.calls, a.seed, a.batch, kinds, a.time_limit, a.mem_gb, progress)
    print(file=sys.stderr)
    for f in rep["failures"]:
        print(f"{f['kind'].upper()} call {f['index']}: {f['call']}\n  "
              + (f.get("detail") or f"rc {f['rc']}, replay: {f['replay']}\n  " + f["stderr"][:600].replace("\n", "\n  ")))
    print(f"seed {a.seed}: {rep['calls']} calls in {rep['seconds']} s: {rep['ok']} ok, {rep['rejected']} rejected, "
          f"{rep['crashes']} crashes, {rep['hangs']} hangs, {rep['bad']} bad results/exceptions"
          + (f", {rep['generator_error']} calls the fuzzer failed to make" if rep["generator_error"] else ""))
    for sl in rep["slowest"]:
        print(f"slow: {sl['seconds']:.2f} s call {sl['index']}: {sl['call'][:200]}")
    for n in rep["notes"]:
        print("note:", n)
    if a.json:
        from engine.checkpoint import write_json
        write_json(a.json, rep, indent=1)
    return 0 if not rep["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
