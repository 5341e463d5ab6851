"""The conv op fits per kernel (engine.perf.conv_tiles): which kernel the
engine runs, the padded tiles' features by hand, known per-kernel costs
recovered on held-out shapes where one polynomial cannot, and the model
pricing a net's layers on them by their geometry."""
import numpy as np
import pytest

from engine import backend, spec as spec_mod
from engine.perf import conv_tiles, fit
from engine.perf.conv_tiles import TILE_FEATURES, conv_algo, tile_features, tiles
from engine.perf.layer_cost import compute_gradient_terms
from engine.perf.profile import Profile
from engine.perf.sweep import QUICK
from engine.perf.sweep_ops import conv_op_shapes, op_path

# Tiles fixed by hand (not the CPU's): the features below are checked against them.
T = {"isa": "test", "mr": 4, "dw_mr": 6, "dw_nr": 16, "dw_l": 8, "lanes_l": 8, "lanes_mb": 2, "lanes_tb": 6}
F = {f: i for i, f in enumerate(TILE_FEATURES)}


def test_tiles_are_the_kernels_of_this_cpu():
    t = tiles()
    info = backend.set_backend("cpu").ext.gemm_info("")
    assert t["mr"] == info["mr"] and t["isa"] == info["isa"]
    assert all(t[k] >= 1 for k in ("dw_mr", "dw_nr", "dw_l", "lanes_l", "lanes_mb", "lanes_tb"))
    assert t["dw_nr"] % t["dw_l"] == 0


def test_tiles_follow_the_isa_in_force(monkeypatch):
    ext = backend.set_backend("cpu").ext
    monkeypatch.setenv("SPRINT_CPU_ISA", "generic")
    assert tiles()["isa"] == "generic" and tiles()["mr"] == ext.gemm_info("generic")["mr"]
    # rows of 6 pixels: a vector wide for the generic lanes kernel (4), not for AVX2's (8) or AVX-512's
    x, wt = np.zeros((1, 1, 6, 6), np.float32), np.zeros((4, 1, 3, 3), np.float32)
    assert conv_algo("conv_bwd_dw", 4, 9, 3, (1, 6, 6)) == "lanes" == ext.conv2d_implicit_dw_kernel(x, wt, 1, 1, 1, 1)
    monkeypatch.delenv("SPRINT_CPU_ISA")
    assert tiles()["isa"] == ext.gemm_info("")["isa"]
    want = ext.conv2d_implicit_dw_kernel(x, wt, 1, 1, 1, 1)
    assert conv_algo("conv_bwd_dw", 4, 9, 3, (1, 6, 6)) == want    # "taps" on AVX2 and AVX-512


def test_padded_tiles_by_hand():
    b, h, w, c = 2, 10, 10, 3
    n = b * h * w
    # forward on the GEMM: 10 filters in rows of MR 4 -> 12
    assert tile_features("conv_fwd", "impl", 10, n, 27, c, (b, h, w), None, T)[0] == 12 * n * 27
    # dW on the tap kernel: 27 taps -> 30 (6), 10 channels -> 16 (8) plus one panel's broadcasts (8)
    assert tile_features("conv_bwd_dw", "taps", 10, n, 27, c, (b, h, w), None, T)[0] == 30 * (16 + 8) * n
    # dW on the lanes kernel: 10 channels in 2s, 27 taps -> 30 (6), the rows' whole vectors: 8 of 10 pixels
    lanes = tile_features("conv_bwd_dw", "lanes", 10, n, 27, c, (b, h, w), None, T)
    assert lanes[0] == 10 * 30 * b * h * 8
    # width 10 is no multiple of 8: every output row ends in a masked vector
    assert lanes[F["tail_fma"]] == 10 * 27 * b * h and lanes[F["tail_pack"]] == 27 * b * h
    whole = tile_features("conv_bwd_dw", "lanes", 10, b * 16 * 16, 27, c, (b, 16, 16), None, T)
    assert whole[F["tail_fma"]] == whole[F["tail_pack"]] == 0.0
    # dW + dX: dX's rows are the 3 input channels -> 4; Winograd's tiles of 4 cover 10 -> 12
    bwd = tile_features("conv_bwd", "taps+impl", 10, n, 27, c, (b, h, w), None, T)
    assert bwd[0] == 30 * 24 * n + 4 * n * 10 * 9
    wino = tile_features("conv_bwd", "taps+wino", 40, n, 27, c, (b, h, w), None, T)
    assert wino[0] == 30 * (40 + 3 * 8) * n + 40 * b * 12 * 12 * 27
    # no tap table but the forward's (sweep_ops.TABLE_OPS)
    assert bwd[F["tap_table"]] == 0.0 and tile_features("conv_fwd", "impl", 10, n, 27, c, (b, h, w), None, T)[
        F["tap_table"]] == n * 9


def test_conv_algo_is_the_engines_dispatch():
    from engine.ops import conv_winograd
    ext = backend.set_backend("cpu").ext
    for C, h, c, M in ((3, 32, 3, 16), (32, 16, 3, 40), (20, 16, 3, 40), (18, 22, 5, 36), (1, 44, 5, 18),
                       (2, 4, 3, 8)):
        x, wt = np.zeros((1, C, h, h), np.float32), np.zeros((M, C, c, c), np.float32)
        dw = ext.conv2d_implicit_dw_kernel(x, wt, 1, 1, (c - 1) // 2, (c - 1) // 2)
        window = (c, c, 1, 1, (c - 1) // 2, (c - 1) // 2)
        fwd = "wino" if conv_winograd.shape_served(window, C) else "impl"
        dx = "wino" if conv_winograd.shape_served(window, M) else "impl"
        k = C * c * c
        assert conv_algo("conv_fwd", M, k, c, (4, h, h)) == fwd
        assert conv_algo("conv_bwd_dw", M, k, c, (4, h, h)) == dw
        assert conv_algo("conv_bwd", M, k, c, (4, h, h)) == f"{dw}+{dx}"
    # small K over rows a vector wide runs the lanes kernel, many taps the tap kernel
    assert conv_algo("conv_bwd_dw", 18, 25, 5, (1, 44, 44)) == "lanes"
    assert conv_algo("conv_bwd_dw", 36, 18 * 25, 5, (1, 22, 22)) == "taps"


def test_conv_algo_follows_the_conv_path(monkeypatch):
    """With the implicit path in force no layer runs Winograd."""
    assert conv_algo("conv_fwd", 48, 40 * 9, 3, (2, 8, 8)) == ("wino" if op_path()["conv"].startswith("winograd")
                                                               else "impl")
    monkeypatch.setenv("SPRINT_CONV_ALGO", "implicit")
    assert conv_algo("conv_fwd", 48, 40 * 9, 3, (2, 8, 8)) == "impl"
    assert conv_algo("conv_bwd", 48, 40 * 9, 3, (2, 8, 8)).endswith("+impl")


# Known costs per kernel: each its own rate and fixed cost, the lanes
# kernel's masked row tail expensive.
TRUE = {"impl": {"1": 20e-6, "mnk": 2e-11, "nk": 1e-9},
        "wino": {"1": 60e-6, "mnk": 0.7e-11, "nk": 3e-9, "mk": 5e-9},
        "lanes": {"1": 15e-6, "mnk": 3e-11, "tail_fma": 6e-11, "tail_pack": 2e-9},
        "taps": {"1": 25e-6, "mnk": 2.5e-11, "nk": 1.2e-9, "m": 1e-7}}


def _truth(kind, algo):
    if kind == "conv_bwd":
        dw, dx = algo.split("+")
        return {f: TRUE[dw].get(f, 0.0) + 2 * TRUE[dx].get(f, 0.0) for f in TILE_FEATURES}
    return TRUE[algo]


def synthetic_records():
    recs = []
    for i, (b, C, H, c, M) in enumerate(conv_op_shapes(dict(QUICK))):
        k, geom = C * c * c, (b, H, H)
        for kind in ("conv_fwd", "conv_bwd_dw", "conv_bwd"):
            algo = conv_algo(kind, M, k, c, geom)
            f = tile_features(kind, algo, M, b * H * H, k, c, geom, None, T)
            t = sum(_truth(kind, algo).get(n, 0.0) * v for n, v in zip(TILE_FEATURES, f))
            recs.append(dict(kind=kind, m=M, n=b * H * H, k=k, c=c, t=t, std=0.0, holdout=i % 4 == 3,
                             path=op_path()["conv"], b=b, h=H, w=H, algo=algo, tiles=T))
    return recs


def test_fit_recovers_each_kernels_costs_on_held_out_shapes(monkeypatch):
    recs = synthetic_records()
    monkeypatch.setattr(conv_tiles, "tiles", lambda: T)
    ops = fit.fit_op_terms(recs)
    for kind in ("conv_fwd", "conv_bwd_dw"):
        o = ops[kind]
        assert o["tiles"] == T and set(o["kernels"]) == {r["algo"] for r in recs if r["kind"] == kind}
        assert o["error"]["holdout"]["n"] > 5 and o["error"]["holdout"]["max"] < 1e-3, (kind, o["error"])
        # the same records on one polynomial of the plain features cannot price them
        plain = fit.fit_op_terms([{k: v for k, v in r.items() if k != "algo"} for r in recs if r["kind"] == kind])
        assert "kernels" not in plain[kind] and plain[kind]["error"]["holdout"]["max"] > 0.05
    # a kernel pair with few records is priced by the pooled fit
    bwd = ops["conv_bwd"]
    few = {a for a in {r["algo"] for r in recs if r["kind"] == "conv_bwd"}
           if sum(r["algo"] == a and not r["holdout"] for r in recs if r["kind"] == "conv_bwd") < 12}
    assert not few & set(bwd["kernels"])
    assert conv_tiles.kernel_coef(bwd, "no-such") is bwd["pooled"]
    # Profile.op with the geometry prices on the kernel; without, on the plain regimes
    p = Profile({"ops": ops})
    for r in [r for r in recs if r["holdout"] and r["kind"] != "conv_bwd"][:12]:
        assert p.op(r["kind"], r["m"], r["n"], r["k"], r["c"], r["b"], r["h"], r["w"]) == pytest.approx(r["t"],
                                                                                                        rel=1e-3)
    r = next(r for r in recs if r["kind"] == "conv_bwd_dw" and r["algo"] == "lanes" and r["w"] % 8)
    plain = p.op(r["kind"], r["m"], r["n"], r["k"], r["c"])
    assert plain != pytest.approx(p.op(r["kind"], r["m"], r["n"], r["k"], r["c"], r["b"], r["h"], r["w"]), rel=1e-6)


def test_profiles_without_kernel_fits_ignore_the_geometry():
    recs = [{k: v for k, v in r.items() if k not in ("b", "h", "w", "algo", "tiles")} for r in synthetic_records()]
    p = Profile({"ops": fit.fit_op_terms(recs)})
    assert p.op("conv_bwd", 36, 12 * 22 * 22, 450, 5) == p.op("conv_bwd", 36, 12 * 22 * 22, 450, 5, 12, 22, 22)


def test_a_nets_layers_are_priced_on_their_kernels(monkeypatch):
    """compute_gradient_terms hands each conv op its geometry: the first
    conv's dW of heldout-k5k-like layers costs its lanes fit, tail and all."""
    monkeypatch.setattr(conv_tiles, "tiles", lambda: T)
    ops = fit.fit_op_terms(synthetic_records())
    p = Profile(dict(Profile.synthetic(backend="cpu").data, ops=ops))
    sp = spec_mod.NetSpec("lanes-tail", 44, 1, 5, ((6, 2),), (10,))
    rows = compute_gradient_terms(sp, 3, p)
    dw = next(r for r in rows if r[2] == "conv_bwd_dw")
    assert dw[3] == (6, 3 * 44 * 44, 25, 5, 3, 44, 44)
    f = tile_features("conv_bwd_dw", "lanes", 6, 3 * 44 * 44, 25, 5, (3, 44, 44), None, T)
    want = sum(_truth("conv_bwd_dw", "lanes").get(n, 0.0) * v for n, v in zip(TILE_FEATURES, f))
    assert conv_algo("conv_bwd_dw", 6, 25, 5, (3, 44, 44)) == "lanes"
    assert p.op(*(("conv_bwd_dw",) + dw[3])) == pytest.approx(want, rel=1e-3)


def test_the_cpu_sweep_records_which_kernel_ran_and_its_geometry():
    from engine.perf.sweep_ops import sweep_conv_ops
    backend.set_backend("cpu")
    cfg = dict(QUICK, batches=(1,), op_shapes=2, op_max=2 ** 14, repeats=1, min_time=1e-5)
    recs = sweep_conv_ops(cfg)
    assert recs and conv_tiles.has_geometry(recs)
    for r in recs:
        assert r["n"] == r["b"] * r["h"] * r["w"] and r["tiles"] == tiles()
        assert r["algo"] == conv_algo(r["kind"], r["m"], r["k"], r["c"], (r["b"], r["h"], r["w"]))


def test_old_records_are_given_their_geometry_on_the_machine_that_swept_them():
    """bench/conv_kernel_records.py walks the records beside the sweep's
    shape list: each gets its batch, side and this machine's kernel; records
    of another CPU, or out of the list's order, are refused."""
    import importlib.util
    from pathlib import Path
    from engine.perf.fingerprint import fingerprint
    path = Path(__file__).resolve().parents[1] / "bench" / "conv_kernel_records.py"
    spec = importlib.util.spec_from_file_location("conv_kernel_records", path)
    ckr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ckr)
    backend.set_backend("cpu")
    old = [{k: v for k, v in r.items() if k not in ("b", "h", "w", "algo", "tiles")} for r in synthetic_records()]
    fc = {"kind": "fc_fwd", "m": 4, "n": 10, "k": 20, "c": 1, "t": 1e-5}
    data = {"meta": {"quick": True, "fingerprint": fingerprint()}, "records": [fc] + old}
    assert ckr.add_geometry(data) == len(old) and "b" not in data["records"][0]
    got = data["records"][1:]
    assert conv_tiles.has_geometry(got) and [r["algo"] for r in got] == [r["algo"] for r in synthetic_records()]
    assert all(r["tiles"] == tiles() and r["n"] == r["b"] * r["h"] * r["w"] for r in got)
    other = dict(fingerprint(), cpu_model="Another CPU")
    with pytest.raises(ckr.Refused, match="not swept on this machine"):
        ckr.add_geometry({"meta": {"quick": True, "fingerprint": other}, "records": old})
    swapped = old[3:6] + old[:3] + old[6:]
    with pytest.raises(ckr.Refused, match="is not the sweep's shape 0"):
        ckr.add_geometry({"meta": {"quick": True, "fingerprint": fingerprint()}, "records": swapped})
    with pytest.raises(ckr.Refused, match="conv op records"):
        ckr.add_geometry({"meta": {"quick": False, "fingerprint": fingerprint()}, "records": old})
