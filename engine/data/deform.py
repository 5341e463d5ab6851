"""DeformImage: per-sample random crop (translation with zero padding),
horizontal flip and scale jitter, then mean/std normalisation -- drawn here on
the host as a small (N, 4) parameter array and applied on the device by
``ops.deform``."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace, asdict
from numbers import Integral

import numpy as np


@dataclass(frozen=True)
class DeformConfig:
    """DeformImage's settings: random crop shift, flip and zoom of the training
    batches, the per-channel normalisation and the output side."""
    crop_pad: int = 0           # shift by up to this many input pixels each way
    flip: bool = False          # mirror horizontally with probability 1/2
    scale: tuple = (1.0, 1.0)   # zoom factor drawn uniformly from this range
    mean: tuple | None = None   # per channel, in [0,1] units; None: 0
    std: tuple | None = None    # per channel; None: 1
    out_hw: tuple | None = None  # output side; None: the input side (else resized)

    def __post_init__(self):
        if isinstance(self.crop_pad, bool) or not isinstance(self.crop_pad, Integral) or self.crop_pad < 0:
            raise ValueError(f"crop_pad must be an integer >= 0, got {self.crop_pad!r}")
        object.__setattr__(self, "crop_pad", int(self.crop_pad))
        lo, hi = (float(v) for v in self.scale)
        if not 0 < lo <= hi < math.inf:
            raise ValueError(f"scale must be a finite range 0 < lo <= hi, got {self.scale}")
        object.__setattr__(self, "scale", (lo, hi))
        for k in ("mean", "std"):
            v = getattr(self, k)
            if v is not None:
                v = tuple(float(a) for a in v)
                if not all(map(math.isfinite, v)):
                    raise ValueError(f"{k} must be finite, got {v}")
                object.__setattr__(self, k, v)
        if self.out_hw is not None:
            hw = tuple(self.out_hw)
            if len(hw) != 2 or any(isinstance(a, bool) or not isinstance(a, Integral) or a < 1 for a in hw):
                raise ValueError(f"out_hw must be two positive integers, got {self.out_hw!r}")
            object.__setattr__(self, "out_hw", tuple(int(a) for a in hw))
        if self.std is not None and any(s <= 0 for s in self.std):
            raise ValueError(f"std must be > 0, got {self.std}")

    @property
    def augments(self) -> bool:
        """Whether anything random is drawn (crop, flip or zoom)."""
        return self.crop_pad > 0 or self.flip or self.scale != (1.0, 1.0)

    def eval(self) -> "DeformConfig":
        """The same geometry and normalisation without random augmentation."""
        return replace(self, crop_pad=0, flip=False, scale=(1.0, 1.0))

    def with_stats(self, dataset) -> "DeformConfig":
        """Fill mean/std from ``dataset`` where they are unset."""
        if self.mean is not None and self.std is not None:
            return self
        mean, std = dataset.channel_stats()
        return replace(self, mean=self.mean or tuple(mean.tolist()), std=self.std or tuple(std.tolist()))

    def to_dict(self) -> dict:
        """The JSON form (a run directory's config.json holds it)."""
        return asdict(self)

    def norm(self, channels):
        """(mean, std) float32 vectors of ``channels`` values (0 and 1 where unset)."""
        mean = np.zeros(channels, np.float32) if self.mean is None else np.asarray(self.mean, np.float32)
        std = np.ones(channels, np.float32) if self.std is None else np.asarray(self.std, np.float32)
        if mean.shape != (channels,) or std.shape != (channels,):
            raise ValueError(f"mean/std need {channels} values, got {mean.shape} and {std.shape}")
        return mean, std

    def draw(self, rng, n, in_hw, out_hw) -> np.ndarray:
        """(n, 4) float32 rows [scale, dy, dx, flip] for ops.deform."""
        p = np.zeros((n, 4), np.float32)
        base = out_hw[0] / in_hw[0]      # resizing is a fixed zoom
        lo, hi = self.scale
        p[:, 0] = base * (rng.uniform(lo, hi, n) if hi > lo else lo)
        if self.crop_pad:
            p[:, 1:3] = rng.integers(-self.crop_pad, self.crop_pad + 1, (n, 2))
        if self.flip:
            p[:, 3] = rng.random(n) < 0.5
        return p


NO_DEFORM = DeformConfig()
