"""Give a sweep's conv op records, made before they carried it, the
geometry and kernel that ``engine.perf.conv_tiles`` fits per kernel on.

Sweeps before held-out set 32 (bench/RESULTS.md section 4) stored each conv
op record's forward GEMM shape (m, n, k, c) only. The shapes they timed are
the deterministic list ``sweep_ops.conv_op_shapes`` of the sweep's mode
(quick or full), in that order, three ops each; this script walks the
records beside that list, checks every shape, and adds the batch, the
input side, the kernel this machine's engine runs each op on and its
tiles. The kernels are this machine's: the records' fingerprint must name
this CPU (model, cores, caches), or the script refuses. The output is a
records file for ``sprint profile --from-records``.

    python bench/conv_kernel_records.py bench/profiles/cpu_test29_records.json bench/profiles/cpu_test29k_records.json
    sprint profile --from-records bench/profiles/cpu_test29k_records.json --out bench/profiles/cpu_test29k.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.checkpoint import atomic_write  # noqa: E402
from engine.perf import conv_tiles  # noqa: E402
from engine.perf.fingerprint import MACHINE_KEYS, differing, fingerprint  # noqa: E402
from engine.perf.sweep import mode_config  # noqa: E402
from engine.perf.sweep_ops import CONV_OPS, conv_op_shapes  # noqa: E402


class Refused(Exception):
    pass


def add_geometry(data: dict, now: dict | None = None) -> int:
    """Add ``b``, ``h``, ``w``, ``algo`` and ``tiles`` to the conv op
    records of a records file's ``data`` in place; returns how many."""
    meta = data.get("meta") or {}
    stored = meta.get("fingerprint") or {}
    diff = {k: v for k, v in differing(stored, now or fingerprint()).items() if k in MACHINE_KEYS}
    if not stored or diff:
        raise Refused("the records were not swept on this machine (" + (
            ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in diff.items()) if diff else "no fingerprint")
            + "): the kernels they ran are not known here")
    if "quick" not in meta:
        raise Refused("the records do not say whether the sweep was quick or full")
    recs = [r for r in data["records"] if r.get("kind") in CONV_OPS]
    shapes = conv_op_shapes(mode_config(bool(meta["quick"])))
    if len(recs) != len(CONV_OPS) * len(shapes):
        raise Refused(f"{len(recs)} conv op records, the sweep's shape list makes {len(CONV_OPS) * len(shapes)}")
    for i, r in enumerate(recs):
        b, C, H, c, M = shapes[i // len(CONV_OPS)]
        if (r["kind"], r["m"], r["n"], r["k"], r["c"]) != (CONV_OPS[i % len(CONV_OPS)], M, b * H * H, C * c * c, c):
            raise Refused(f"conv op record {i} ({r['kind']} m={r['m']} n={r['n']} k={r['k']} c={r['c']}) is not "
                          f"the sweep's shape {i // len(CONV_OPS)} (b={b} C={C} H={H} c={c} M={M})")
        r.update(b=b, h=H, w=H, algo=conv_tiles.conv_algo(r["kind"], M, C * c * c, c, (b, H, H)),
                 tiles=conv_tiles.tiles())
    return len(recs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="a records file of `sprint profile --records` (read)")
    ap.add_argument("out", help="the records file to write, with the conv records' geometry")
    a = ap.parse_args(argv)
    try:
        data = json.loads(Path(a.records).read_text())
        n = add_geometry(data)
    except (OSError, ValueError, KeyError, Refused) as e:
        print(f"conv_kernel_records: error: {a.records}: {e}", file=sys.stderr)
        return 1
    atomic_write(a.out, json.dumps(data))
    print(f"{n} conv op records given their geometry and kernel: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
