"""Cost model of layer-wise parallelism (OptCNN) and the plans it produces.

Every layer of a SPRINT network gets a configuration ``(n, c, h, w)``: how
many ways it splits the sample, output-channel (output feature for FC),
height and width dimensions of its output. It runs on devices
``0 .. n*c*h*w - 1``; device ``k`` owns the block ``unravel(k, (n, c, h, w))``
(row-major). A plan is data: ``Plan`` holds one configuration per layer,
``sprint plan`` writes it and ``engine.parallel.layerwise`` executes it.

Costs, all from the machine profile (the same rows as every other model):

* ``t_c``: the layer's forward + backward kernels at the block's sub-shape
  (``engine.perf.model.layer_kernels`` priced on a geometry of the block; a
  spatial block also convolves its halo rows, which only the im2col sees);
* ``t_x(edge)``: the elements each consumer device needs (its sample rows,
  every input channel, its output rows plus the kernel's halo) minus what it
  already holds as the producer's block on the same device id; forward and
  back, the busiest device's volume priced as one point-to-point message
  (``engine.perf.pipeline.p2p_time``), plus a reduce-scatter of the input
  gradient among a channel-split consumer's ``c`` devices (each holds a
  partial sum of it);
* ``t_s``: the allreduce of the layer's parameter slice among its
  ``n*h*w`` replicas and the momentum update of that slice.

The step time of a plan is the sum of all of them (no overlap, as OptCNN).
Only degrees that divide the shape are considered, so every plan the search
returns can be executed as is.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import numpy as np

from engine import spec as spec_mod
from .layerwise_search import CostGraph, search

FORMAT = "sprint-layerwise-plan"
DIMS = ("n", "c", "h", "w")


@dataclass(frozen=True)
class Node:
    name: str
    kind: str              # conv | fc | softmax
    geom: object           # LayerGeom (None for softmax)
    out: tuple             # per-sample output (C, H, W)
    first: bool = False


def graph_nodes(spec) -> list:
    """The computation graph of a SPRINT net: its layers, then the softmax (a chain)."""
    sp = spec_mod.get_spec(spec)
    nodes = []
    for i, g in enumerate(spec_mod.layers(sp)):
        out = tuple(g.out_shape) if g.kind == "conv" else (g.out_shape[0], 1, 1)
        nodes.append(Node(g.name, g.kind, g, out, first=i == 0))
    nodes.append(Node("softmax", "softmax", None, (sp.n_classes, 1, 1)))
    return nodes


def _divisors(x):
    return [d for d in range(1, x + 1) if x % d == 0]


def configs(node: Node, n_dev: int, batch: int) -> list:
    """Every (n, c, h, w) of ``node`` whose degrees divide the batch and the
    output's channels and sides and whose product divides ``n_dev``."""
    ds = _divisors(n_dev)
    C, H, W = node.out
    out = []
    for n in ds:
        if batch % n:
            continue
        for c in ds if node.kind != "softmax" else (1,):
            if C % c or n_dev % (n * c):
                continue
            for h, w in _spatial(ds, H, W) if node.kind == "conv" else [(1, 1)]:
                if H % h or W % w or n_dev % (n * c * h * w):
                    continue
                out.append((n, c, h, w))
    return out


def _spatial(ds, H, W):
    """One (h, w) grid per spatial degree: the squarest that divides the
    sides, h >= w. Any other grid of the same degree moves more halo (its
    perimeter is longer) for the same compute, so it never wins."""
    out = {}
    for h in ds:
        for w in ds:
            if h >= w and H % h == 0 and W % w == 0 and (h * w not in out or h - w < out[h * w][0] - out[h * w][1]):
                out[h * w] = (h, w)
    return sorted(out.values())


def _blocks(cfg, shape4, n_dev):
    """(lo, hi) [n_dev, 4] of the block each device owns (empty past n*c*h*w)."""
    d = int(np.prod(cfg))
    idx = np.array(np.unravel_index(np.arange(d), cfg)).T
    S, deg = np.array(shape4), np.array(cfg)
    lo = np.zeros((n_dev, 4), np.int64)
    hi = np.zeros((n_dev, 4), np.int64)
    lo[:d] = idx * S // deg
    hi[:d] = (idx + 1) * S // deg
    return lo, hi


def _needed(node: Node, cfg, in4, n_dev):
    """(lo, hi) of the input each device of ``node`` reads under ``cfg``."""
    lo, hi = _blocks(cfg, (in4[0],) + tuple(node.out), n_dev)
    d = int(np.prod(cfg))
    lo[:d, 1], hi[:d, 1] = 0, in4[1]                # every input channel
    if node.kind == "conv":
        p, pad = node.geom.pool, (node.geom.w_shape[2] - 1) // 2
        lo[:d, 2:] = np.maximum(lo[:d, 2:] * p - pad, 0)
        hi[:d, 2:] = np.minimum(hi[:d, 2:] * p + pad, np.array(in4[2:]))
    else:                                           # fc / softmax read whole samples
        lo[:d, 2:], hi[:d, 2:] = 0, np.array(in4[2:])
    return lo, hi


def _p2p(profile):
    from .pipeline import p2p_time
    lat = p2p_time(profile, 0)
    return lat, (p2p_time(profile, 1_000_000) - lat) / 1_000_000


def edge_costs(prod: Node, pcfgs, cons: Node, ccfgs, batch, n_dev, profile):
    """(seconds, bytes) matrices [len(pcfgs), len(ccfgs)] of redistributing
    ``prod``'s output into ``cons``'s layout, forward and backward."""
    in4 = (batch,) + tuple(prod.out)
    P = [_blocks(c, in4, n_dev) for c in pcfgs]
    Q = [_needed(cons, c, in4, n_dev) for c in ccfgs]
    plo, phi = np.stack([p[0] for p in P]), np.stack([p[1] for p in P])
    qlo, qhi = np.stack([q[0] for q in Q]), np.stack([q[1] for q in Q])
    # per dimension in int32 (each extent is small), the product in float64 (exact below 2^53)
    ov = np.ones((len(pcfgs), len(ccfgs), n_dev))
    for d in range(4):
        a_lo, a_hi = plo[:, None, :, d].astype(np.int32), phi[:, None, :, d].astype(np.int32)
        ext = np.minimum(a_hi, qhi[None, :, :, d].astype(np.int32))
        ext -= np.maximum(a_lo, qlo[None, :, :, d].astype(np.int32))
        ov *= np.maximum(ext, 0)
    need = (qhi - qlo).prod(-1).astype(float)        # [Kb, N]
    inc = need[None] - ov                            # [Ka, Kb, N] elements each device receives
    cdeg = np.array([c[1] for c in ccfgs], float)
    red = need.max(-1) * (cdeg - 1) / cdeg            # reduce-scatter of partial input gradients
    lat, per = _p2p(profile)
    mx = inc.max(-1).astype(float)
    t = np.where(mx > 0, 2 * (lat + per * mx), 0.0) + np.where(red > 0, lat + per * red, 0.0)[None]
    red_bytes = (need.sum(-1) * (cdeg - 1) / cdeg)[None]
    return t, 4.0 * (2 * inc.sum(-1) + red_bytes)


def _sub_geom(node: Node, cfg, batch):
    n, c, h, w = cfg
    g = node.geom
    b = batch // n
    if node.kind == "conv":
        m, cin, k1, _ = g.w_shape
        m //= c
        p = g.pool
        th, tw = node.out[1] // h, node.out[2] // w
        k, cols = cin * k1 * k1, b * th * p * tw * p
        return b, dataclasses.replace(g, out_shape=(m, th, tw), w_shape=(m, cin, k1, k1), b_shape=(m,),
                                      gemm_fwd=(m, cols, k), gemm_dw=(m, k, cols), gemm_dx=(k, cols, m),
                                      im2col_elems=k * cols, extra={"conv_out": (m, th * p, tw * p)})
    m, fin = g.w_shape
    m //= c
    return b, dataclasses.replace(g, out_shape=(m,), w_shape=(m, fin), b_shape=(m,),
                                  gemm_fwd=(b, m, fin), gemm_dw=(m, fin, b), gemm_dx=(b, fin, m))


def t_compute(node: Node, cfg, batch, profile) -> float:
    """Forward + backward seconds of one device's block."""
    from .model import kernel_time, layer_kernels
    if hasattr(profile, "layer_time"):          # measured blocks (engine.perf.layerwise_measure)
        return profile.layer_time(node, cfg, batch)
    factor = profile.overhead("kernel_factor") or 1.0
    if node.kind == "softmax":
        return factor * profile.term("softmax", (batch // cfg[0]) * node.out[0])
    b, sub = _sub_geom(node, cfg, batch)
    ops = profile.op_kinds() if hasattr(profile, "op_kinds") else set()
    t = sum(kernel_time(profile, k, s) for _, k, s in layer_kernels(sub, b, node.first, False, ops))
    return factor * t + profile.overhead("per_layer")


def t_sync(node: Node, cfg, profile):
    """(seconds, bytes): allreduce of the parameter slice among its replicas + its update."""
    if node.kind == "softmax":
        return 0.0, 0.0
    n, c, h, w = cfg
    r, p = n * h * w, node.geom.n_params // c
    vec = lambda name: profile.term(name, p) if profile.has(name) else 0.0
    t = vec("scale") + vec("sub") + vec("add")
    if r > 1:
        t += profile.allreduce_bw(r, p)
    return t, 4.0 * 2 * (r - 1) * p * c


def cost_graph(spec, n_dev: int, batch: int, profile):
    """(CostGraph, nodes, {node: configs}, {edge: bytes matrix}) of a net."""
    nodes = graph_nodes(spec)
    cfgs = {v.name: configs(v, n_dev, batch) for v in nodes}
    for v in nodes:
        if not cfgs[v.name]:
            raise ValueError(f"{v.name}: no configuration divides batch {batch} on {n_dev} devices")
    g = CostGraph({v.name: np.array([t_compute(v, c, batch, profile) + t_sync(v, c, profile)[0]
                                     for c in cfgs[v.name]]) for v in nodes})
    nbytes = {}
    for a, b in zip(nodes, nodes[1:]):
        t, by = edge_costs(a, cfgs[a.name], b, cfgs[b.name], batch, n_dev, profile)
        g.add_edge(a.name, b.name, t)
        nbytes[(a.name, b.name)] = by
    return g, nodes, cfgs, nbytes


@dataclass
class Plan:
    """One configuration per node of the net's graph; JSON is its file form."""
    model: str
    spec_hash: str
    devices: int
    batch: int
    layers: dict                 # name -> (n, c, h, w)
    predicted: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": 1, "model": self.model, "spec_hash": self.spec_hash,
                "devices": self.devices, "batch": self.batch,
                "layers": [dict(name=k, **dict(zip(DIMS, v))) for k, v in self.layers.items()],
                "predicted": self.predicted}

    @classmethod
    def from_dict(cls, d, where="plan") -> "Plan":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"{where} is not a layer-wise plan (no \"format\": \"{FORMAT}\")")
        try:
            layers = {str(e["name"]): tuple(_deg(e[k], f"{where}: {e['name']}.{k}") for k in DIMS)
                      for e in d["layers"]}
            return cls(str(d["model"]), str(d["spec_hash"]), _deg(d["devices"], f"{where}: devices"),
                       _deg(d["batch"], f"{where}: batch"), layers, dict(d.get("predicted", {})))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: missing or malformed entry {e}") from None

    def save(self, path):
        from engine.checkpoint import atomic_write
        return atomic_write(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path) -> "Plan":
        from pathlib import Path
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read plan {p} ({e})") from None
        return cls.from_dict(d, where=f"plan {p}")


def _deg(v, what):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{what} must be a positive integer, got {v!r}")
    return v


def check_plan(plan: Plan, spec, ranks: int = None, batch: int = None):
    """Refuse a plan that does not fit this net, batch or rank count (one message each)."""
    sp = spec_mod.get_spec(spec)
    nodes = graph_nodes(sp)
    names = [v.name for v in nodes]
    if plan.spec_hash != sp.hash() or list(plan.layers) != names:
        raise ValueError(f"the plan is for model {plan.model!r} ({plan.spec_hash}), not {sp.name!r} "
                         f"({sp.hash()})")
    if batch is not None and batch != plan.batch:
        # `sprint plan` plans 32 samples per device and --batch defaults to 32 in all:
        # a plan for 2 devices and a run's own default disagree, so say what to give
        raise ValueError(f"the plan was made for batch {plan.batch}, the run uses --batch {batch}; "
                         f"give --batch {plan.batch}")
    for v in nodes:
        cfg = plan.layers[v.name]
        d = math.prod(cfg)
        if ranks is not None and d > ranks:
            raise ValueError(f"{v.name}: configuration {cfg} needs {d} devices, the job has {ranks} rank(s)")
        if d > plan.devices:
            raise ValueError(f"{v.name}: configuration {cfg} needs {d} devices, the plan has {plan.devices}")
        n, c, h, w = cfg
        C, H, W = v.out
        if plan.batch % n or C % c or H % h or W % w or (v.kind != "conv" and (h, w) != (1, 1)) \
                or (v.kind == "softmax" and c != 1):
            raise ValueError(f"{v.name}: configuration {dict(zip(DIMS, cfg))} does not divide its output "
                             f"(batch {plan.batch} x {'x'.join(map(str, v.out))}) or splits a dimension "
                             f"a {v.kind} layer cannot split")


@dataclass
class Evaluation:
    rows: list                   # [{name, config, t_c, t_x, t_s, bytes}]
    step_s: float
    comm_bytes: float
    throughput: float


def evaluate(spec, layers: dict, n_dev: int, batch: int, profile) -> Evaluation:
    """Per-node costs of one plan (the same functions the search used)."""
    nodes = graph_nodes(spec)
    rows, prev = [], None
    for v in nodes:
        cfg = tuple(layers[v.name])
        tx, bx = 0.0, 0.0
        if prev is not None:
            t, by = edge_costs(prev, [layers[prev.name]], v, [cfg], batch, n_dev, profile)
            tx, bx = float(t[0, 0]), float(by[0, 0])
        ts, bs = t_sync(v, cfg, profile)
        rows.append({"name": v.name, "config": cfg, "t_c": t_compute(v, cfg, batch, profile),
                     "t_x": tx, "t_s": ts, "bytes": bx + bs})
        prev = v
    step = sum(r["t_c"] + r["t_x"] + r["t_s"] for r in rows)
    return Evaluation(rows, step, sum(r["bytes"] for r in rows), batch / step if step > 0 else math.inf)


def optimize(spec, n_dev: int, batch: int, profile) -> Plan:
    """The cheapest plan under the model (engine.perf.layerwise_search)."""
    import time
    sp = spec_mod.get_spec(spec)
    t0 = time.perf_counter()
    g, nodes, cfgs, _ = cost_graph(sp, n_dev, batch, profile)
    t1 = time.perf_counter()
    res = search(g)
    t2 = time.perf_counter()
    layers = {v.name: cfgs[v.name][res.choice[v.name]] for v in nodes}
    ev = evaluate(sp, layers, n_dev, batch, profile)
    return Plan(sp.name, sp.hash(), n_dev, batch, layers,
                {"step_s": ev.step_s, "throughput": ev.throughput, "comm_bytes": ev.comm_bytes,
                 "search_cost_s": res.cost, "cost_table_s": t1 - t0, "search_s": t2 - t1,
                 "configurations": sum(len(c) for c in cfgs.values()),
                 "profile": getattr(profile, "source", "?")})


def _largest_divisor(x, limit):
    return max(d for d in _divisors(limit) if x % d == 0)


def named_plan(kind: str, spec, n_dev: int, batch: int) -> Plan:
    """The single strategies as layer-wise plans: ``data`` (every layer split
    over samples), ``model`` (every layer over output channels/features, as
    far as they divide), ``owt`` (Krizhevsky's one weird trick: data-parallel
    convolutions, model-parallel FC layers, data-parallel softmax)."""
    sp = spec_mod.get_spec(spec)
    layers = {}
    for v in graph_nodes(sp):
        n = _largest_divisor(batch, n_dev)
        c = _largest_divisor(v.out[0], n_dev) if v.kind != "softmax" else 1
        if kind == "data" or (kind == "owt" and v.kind in ("conv", "softmax")):
            layers[v.name] = (n, 1, 1, 1)
        elif kind in ("model", "owt"):
            layers[v.name] = (1, c, 1, 1)
        else:
            raise ValueError(f"unknown named plan {kind!r} (data, model, owt)")
    return Plan(sp.name, sp.hash(), n_dev, batch, layers)
