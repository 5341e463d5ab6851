"""Network specifications of the SPRINT CNN family (SPEC section 1).

A network is fixed by the input side ``x0``, input channels ``m0``, kernel
side ``c``, a list of conv layers ``(m_l, p_l)`` and a list of FC widths.
Everything that only depends on the spec -- shapes, the flat parameter
layout, N_Param, FLOPs and the SGEMM shapes of every pass -- lives here so
that the network, the distributed runner and the performance model agree on
one geometry without building a network.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, asdict
from pathlib import Path


@dataclass(frozen=True)
class NetSpec:
    name: str
    x0: int
    m0: int
    c: int
    convs: tuple  # ((m_l, p_l), ...)
    fcs: tuple    # (m_l, ...); the last one is the number of classes

    def __post_init__(self):
        object.__setattr__(self, "convs", tuple((int(m), int(p)) for m, p in self.convs))
        object.__setattr__(self, "fcs", tuple(int(m) for m in self.fcs))
        for arg in ("x0", "m0", "c"):
            v = getattr(self, arg)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"NetSpec.{arg} must be a positive int, got {v!r}")
        if self.c % 2 != 1:
            raise ValueError(f"NetSpec.c must be odd so that padding keeps the side, got {self.c}")
        if not self.fcs:
            raise ValueError("NetSpec.fcs must name at least the output layer")
        x = self.x0
        for i, (m, p) in enumerate(self.convs):
            if m < 1 or p < 1:
                raise ValueError(f"NetSpec.convs[{i}] = {(m, p)}: filters and pooling must be >= 1")
            if x % p:
                raise ValueError(f"NetSpec.convs[{i}]: side {x} is not divisible by pooling {p}")
            x //= p
        for i, m in enumerate(self.fcs):
            if m < 1:
                raise ValueError(f"NetSpec.fcs[{i}] must be >= 1, got {m}")

    @property
    def n_classes(self) -> int:
        return self.fcs[-1]

    @property
    def input_shape(self) -> tuple:
        return (self.m0, self.x0, self.x0)

    @property
    def pad(self) -> int:
        return (self.c - 1) // 2

    def to_dict(self) -> dict:
        d = asdict(self)
        d["convs"] = [list(t) for t in self.convs]
        d["fcs"] = list(self.fcs)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "NetSpec":
        missing = {"x0", "m0", "convs", "fcs"} - set(d)
        if missing:
            raise ValueError(f"network spec is missing {sorted(missing)}")
        return cls(name=str(d.get("name", "custom")), x0=int(d["x0"]), m0=int(d["m0"]),
                   c=int(d.get("c", 3)), convs=tuple(tuple(t) for t in d["convs"]),
                   fcs=tuple(d["fcs"]))

    def hash(self) -> str:
        import hashlib
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _vgg(name, blocks, fcs=(4096, 4096, 1000)):
    convs = []
    for width, reps in blocks:
        convs += [(width, 1)] * (reps - 1) + [(width, 2)]
    return NetSpec(name, 224, 3, 3, tuple(convs), fcs)


# cnn-a/b/c follow VGG configurations A, B and D (Simonyan & Zisserman): the
# seed's own layer lists are lost, and VGG is the 3x3-kernel family it used.
PRESETS = {
    "tiny": NetSpec("tiny", 8, 2, 3, ((3, 2), (4, 1)), (6, 3)),
    "digits": NetSpec("digits", 8, 1, 3, ((32, 1), (64, 2)), (128, 10)),
    "cifar": NetSpec("cifar", 32, 3, 3,
                     ((64, 1), (64, 2), (128, 1), (128, 2), (256, 1), (256, 2)), (512, 10)),
    "cnn-a": _vgg("cnn-a", [(64, 1), (128, 1), (256, 2), (512, 2), (512, 2)]),
    "cnn-b": _vgg("cnn-b", [(64, 2), (128, 2), (256, 2), (512, 2), (512, 2)]),
    "cnn-c": _vgg("cnn-c", [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]),
}


def get_spec(name_or_path) -> NetSpec:
    """A preset by name, or a JSON/YAML file holding a spec dict."""
    if isinstance(name_or_path, NetSpec):
        return name_or_path
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(key)
    if not path.exists():
        raise ValueError(f"model {key!r} is neither a preset {sorted(PRESETS)} nor a spec file")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml
        d = yaml.safe_load(text)
    else:
        d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError(f"spec file {path} must hold a mapping")
    d.setdefault("name", path.stem)
    return NetSpec.from_dict(d)


@dataclass
class LayerGeom:
    """One parametric layer and the work of each pass, for one batch of ``n``."""
    index: int
    kind: str            # "conv" or "fc"
    name: str
    in_shape: tuple      # (C, H, W) per sample
    out_shape: tuple     # after ReLU/pooling, per sample
    w_shape: tuple
    b_shape: tuple
    pool: int = 1
    relu: bool = True
    # SGEMM shapes (m, n, k) of forward, dW and dX for the batch
    gemm_fwd: tuple = ()
    gemm_dw: tuple = ()
    gemm_dx: tuple = ()
    im2col_elems: int = 0   # elements of the column matrix (0 for FC)
    flops_fwd: int = 0
    flops_bwd: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def n_params(self) -> int:
        return _prod(self.w_shape) + _prod(self.b_shape)


def _prod(t):
    r = 1
    for v in t:
        r *= int(v)
    return r


def layers(spec: NetSpec, n: int = 1) -> list:
    """Geometry of every parametric layer for a batch of ``n`` samples."""
    out = []
    ch, x = spec.m0, spec.x0
    c = spec.c
    for i, (m, p) in enumerate(spec.convs):
        k = c * c * ch
        cols = x * x * n
        g = LayerGeom(index=len(out), kind="conv", name=f"conv{i + 1}", in_shape=(ch, x, x),
                      out_shape=(m, x // p, x // p), w_shape=(m, ch, c, c), b_shape=(m,), pool=p,
                      gemm_fwd=(m, cols, k), gemm_dw=(m, k, cols), gemm_dx=(k, cols, m),
                      im2col_elems=k * cols)
        g.flops_fwd = 2 * m * k * cols
        g.flops_bwd = 2 * m * k * cols * (2 if i > 0 else 1)
        g.extra["conv_out"] = (m, x, x)
        out.append(g)
        ch, x = m, x // p
    fin = ch * x * x
    for j, m in enumerate(spec.fcs):
        last = j == len(spec.fcs) - 1
        g = LayerGeom(index=len(out), kind="fc", name=f"fc{j + 1}", in_shape=(ch, x, x) if j == 0 else (fin,),
                      out_shape=(m,), w_shape=(m, fin), b_shape=(m,), relu=not last,
                      gemm_fwd=(n, m, fin), gemm_dw=(m, fin, n), gemm_dx=(n, fin, m))
        g.flops_fwd = 2 * n * m * fin
        g.flops_bwd = 4 * n * m * fin
        out.append(g)
        fin = m
    return out


def n_params_formula(spec: NetSpec) -> int:
    """N_Param exactly as SPEC section 1 writes it."""
    total, prev, x = 0, spec.m0, spec.x0
    for m, p in spec.convs:
        total += m * (spec.c ** 2 * prev + 1)
        prev, x = m, x // p
    for m in spec.fcs:
        total += m * (x * x * prev + 1)
        prev, x = m, 1
    return total


def param_layout(spec: NetSpec) -> list:
    """(layer name, "W"|"b", shape, offset) of every tensor in the flat vector.

    Weights then bias, layer by layer: the order a checkpoint and the
    allreduce see, so it must never change silently.
    """
    out, off = [], 0
    for g in layers(spec):
        for part, shape in (("W", g.w_shape), ("b", g.b_shape)):
            out.append((g.name, part, shape, off))
            off += _prod(shape)
    return out


def n_params(spec: NetSpec) -> int:
    return sum(g.n_params for g in layers(spec))


def summary_table(spec: NetSpec, n: int = 1) -> str:
    rows = [("layer", "in", "out", "params", "MFLOP fwd", "MFLOP bwd")]
    tot_p = tot_f = tot_b = 0
    for g in layers(spec, n):
        rows.append((g.name + (f"/p{g.pool}" if g.pool > 1 else ""), "x".join(map(str, g.in_shape)),
                     "x".join(map(str, g.out_shape)), f"{g.n_params:,}",
                     f"{g.flops_fwd / 1e6:.2f}", f"{g.flops_bwd / 1e6:.2f}"))
        tot_p += g.n_params
        tot_f += g.flops_fwd
        tot_b += g.flops_bwd
    rows.append(("total", "", "", f"{tot_p:,}", f"{tot_f / 1e6:.2f}", f"{tot_b / 1e6:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{spec.name}: input {spec.m0}x{spec.x0}x{spec.x0}, kernel {spec.c}x{spec.c}, batch {n}"]
    for r in rows:
        lines.append("  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)
