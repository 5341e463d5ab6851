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
from numbers import Integral
from pathlib import Path


@dataclass(frozen=True)
class NetSpec:
    """One network of the family: input side ``x0``, channels ``m0``, kernel
    side ``c``, conv layers ``(m_l, p_l)`` and FC widths (the last = classes)."""
    name: str
    x0: int
    m0: int
    c: int
    convs: tuple  # ((m_l, p_l), ...)
    fcs: tuple    # (m_l, ...); the last one is the number of classes

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")
        for arg in ("x0", "m0", "c"):
            object.__setattr__(self, arg, _count(getattr(self, arg), arg))
        object.__setattr__(self, "convs", tuple(_conv(t, i) for i, t in enumerate(_seq(self.convs, "convs"))))
        object.__setattr__(self, "fcs", tuple(_count(m, f"fcs[{i}]") for i, m in enumerate(_seq(self.fcs, "fcs"))))
        if self.c % 2 != 1:
            raise ValueError(f"c must be odd so that padding keeps the side, got {self.c}")
        if not self.fcs:
            raise ValueError("fcs must name at least the output layer")
        x, prev = self.x0, self.m0
        sizes = [("the input", self.m0 * self.x0 * self.x0)]
        for i, (m, p) in enumerate(self.convs):
            if x % p:
                raise ValueError(f"convs[{i}]: side {x} is not divisible by pooling {p}")
            sizes += [(f"convs[{i}]'s unfolded input", prev * self.c * self.c * x * x),
                      (f"convs[{i}]'s output", m * x * x)]
            x, prev = x // p, m
        prev *= x * x
        for i, m in enumerate(self.fcs):
            sizes.append((f"fcs[{i}]'s weights", prev * m))
            prev = m
        # Each count fits a 32-bit argument on its own (_count); their
        # products, the sizes the kernels are called with, must too.
        for what, n in sizes:
            if n > MAX_COUNT:
                raise ValueError(f"{what} holds {n:,} values for one sample, more than the kernels' "
                                 f"32-bit sizes take ({MAX_COUNT:,}): use a smaller x0, fewer channels "
                                 f"or narrower layers")

    @property
    def n_classes(self) -> int:
        """Width of the output layer."""
        return self.fcs[-1]

    @property
    def input_shape(self) -> tuple:
        """(m0, x0, x0): one sample as the net takes it."""
        return (self.m0, self.x0, self.x0)

    @property
    def pad(self) -> int:
        """Zero padding that keeps the side of a c x c convolution."""
        return (self.c - 1) // 2

    def to_dict(self) -> dict:
        """The JSON form (what a spec file holds)."""
        d = asdict(self)
        d["convs"] = [list(t) for t in self.convs]
        d["fcs"] = list(self.fcs)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "NetSpec":
        """A spec from its dict form; strict: the keys of SPEC_KEYS only, and
        integers (not floats, not booleans) wherever a count is meant."""
        if not isinstance(d, dict):
            raise ValueError(f"a network spec must be a mapping, got {type(d).__name__}")
        unknown = sorted(str(k) for k in d if k not in SPEC_KEYS)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}; a spec has {list(SPEC_KEYS)}")
        missing = [k for k in SPEC_KEYS if k not in d and k not in ("name", "c")]
        if missing:
            raise ValueError(f"network spec is missing {missing}")
        return cls(name=d.get("name", "custom"), x0=d["x0"], m0=d["m0"], c=d.get("c", 3),
                   convs=d["convs"], fcs=d["fcs"])

    def hash(self) -> str:
        """Short digest of the spec (checkpoints and ranks compare it)."""
        import hashlib
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


SPEC_KEYS = ("name", "x0", "m0", "c", "convs", "fcs")
MAX_COUNT = 2**31 - 1   # every size must fit the kernels' 32-bit arguments


def _count(v, what):
    """``v`` as a positive int; floats (even 8.0) and booleans are refused, not coerced."""
    if isinstance(v, bool) or not isinstance(v, Integral):   # (NumPy ints are Integral)
        raise ValueError(f"{what} must be a positive integer, got {v!r} ({type(v).__name__})")
    if not 1 <= v <= MAX_COUNT:
        raise ValueError(f"{what} must be an integer in [1, {MAX_COUNT}], got {v}")
    return int(v)


def _seq(v, what):
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__iter__"):
        raise ValueError(f"{what} must be a list, got {v!r}")
    return list(v)


def _conv(t, i):
    t = _seq(t, f"convs[{i}]")
    if len(t) != 2:
        raise ValueError(f"convs[{i}] must be a pair [filters, pooling], got {t!r}")
    return _count(t[0], f"convs[{i}][0] (filters)"), _count(t[1], f"convs[{i}][1] (pooling)")


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
    # 2.4 MFLOP per image: about 1,600 img/s on one core here, so an MNIST
    # epoch (60,000 images) takes well under a minute on a laptop CPU.
    "mnist": NetSpec("mnist", 28, 1, 3, ((16, 2), (32, 2)), (128, 10)),
    "cifar": NetSpec("cifar", 32, 3, 3,
                     ((64, 1), (64, 2), (128, 1), (128, 2), (256, 1), (256, 2)), (512, 10)),
    "cnn-a": _vgg("cnn-a", [(64, 1), (128, 1), (256, 2), (512, 2), (512, 2)]),
    "cnn-b": _vgg("cnn-b", [(64, 2), (128, 2), (256, 2), (512, 2), (512, 2)]),
    "cnn-c": _vgg("cnn-c", [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]),
}

# The presets whose default learning rate is the strategy's times this factor.
# cifar (six 3x3 convs and FC 512, no normalisation, He init) diverges at the
# strategies' 0.05 and at 0.01 within a few epochs, and PyTorch's twin of it
# (same weights, batches and SGD) diverges at the same steps: measured on
# tests/cifar_like.py's data, 2026-12-01. At 0.005 it trains (100 % in 2 epochs).
# The VGG presets (cnn-a/b/c, no normalisation either) diverge at 0.05 by their
# second step (loss 7,000-34,000, NaN at step 3-4), batch 8 of that stand-in
# scaled to 224x224, and so does PyTorch's twin of each (same weights, batches
# and SGD; the same losses to 0.1 %). At 0.001 (VGG's 0.01 for batch 256, scaled
# to the default batch 32) their loss falls from 9-10.5 to 2.3-4.8 in 10 steps.
# Real CIFAR-10 and ImageNet were not at hand.
PRESET_LR_SCALE = {"cifar": 0.1, "cnn-a": 0.02, "cnn-b": 0.02, "cnn-c": 0.02}

# One line per preset for `sprint info` and error messages: what it is for.
PRESET_NOTES = {
    "tiny": "8x8x2, 3 classes: for tests",
    "digits": "8x8x1, 10 classes: the embedded handwritten digits, the default",
    "mnist": "28x28x1, 10 classes: MNIST IDX files",
    "cifar": "32x32x3, 10 classes: CIFAR-10 binary batches",
    "cnn-a": "224x224x3, 1000 classes: VGG configuration A",
    "cnn-b": "224x224x3, 1000 classes: VGG configuration B",
    "cnn-c": "224x224x3, 1000 classes: VGG configuration D",
}


def preset_lines() -> list:
    """'name  note  (N parameters)' for every preset, in PRESETS order."""
    w = max(map(len, PRESETS))
    return [f"{name.ljust(w)}  {PRESET_NOTES[name]} ({n_params(spec):,} parameters)"
            for name, spec in PRESETS.items()]


MAX_SPEC_BYTES = 1 << 20   # a spec is a few lines; anything larger is not one


def get_spec(name_or_path) -> NetSpec:
    """A preset by name, a NetSpec, a spec dict, or a JSON/YAML file holding one.

    A file is read strictly (see NetSpec.from_dict); every problem is a
    ValueError naming the file."""
    if isinstance(name_or_path, NetSpec):
        return name_or_path
    if isinstance(name_or_path, dict):
        return NetSpec.from_dict(name_or_path)
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(key)
    if not path.exists():
        from engine.errors import RunError
        raise RunError(f"model {key!r} is neither a preset {list(PRESETS)} nor a spec file", "--model")
    try:
        d = _read_spec_file(path)
        if isinstance(d, dict):
            d.setdefault("name", path.stem)
        return NetSpec.from_dict(d)
    except ValueError as e:
        from engine.errors import RunError
        # the option too, as for a name that is no file: `--model runs/` said
        # "spec file runs: is a directory, not a spec file", naming none
        raise RunError(f"spec file {path}: {e}", "--model") from None


def _reject_constant(name):
    raise ValueError(f"{name} is not a number a spec can hold")


def _read_spec_file(path: Path):
    if path.is_dir():
        raise ValueError("is a directory, not a spec file")
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise ValueError(f"{path.stat().st_size:,} bytes is too large for a spec (at most {MAX_SPEC_BYTES:,})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read it ({e})") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml
            try:
                return yaml.safe_load(text)     # safe_load: tags never construct objects
            except yaml.YAMLError as e:
                raise ValueError(f"not valid YAML: {' '.join(str(e).split())}") from None
        try:
            return json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError("nested too deeply to be a spec") from None


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
