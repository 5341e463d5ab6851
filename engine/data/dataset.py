"""An in-memory labelled image set: x (N, C, H, W) uint8 or float32, y int64."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Dataset:
    x: np.ndarray
    y: np.ndarray
    n_classes: int
    name: str = ""
    skipped: int = 0                       # unreadable/corrupt files left out
    classes: list = field(default_factory=list)
    skipped_files: list = field(default_factory=list)

    def __post_init__(self):
        self.x = np.ascontiguousarray(self.x)
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if self.x.ndim != 4:
            raise ValueError(f"{self.name or 'dataset'}: x must be (N, C, H, W), got shape {self.x.shape}")
        if self.x.dtype not in (np.uint8, np.float32):
            raise TypeError(f"{self.name or 'dataset'}: x must be uint8 or float32, got {self.x.dtype}")
        if len(self.x) == 0:
            raise ValueError(f"{self.name or 'dataset'}: dataset is empty"
                             + (f" ({self.skipped} unreadable files skipped)" if self.skipped else ""))
        if self.y.shape != (len(self.x),):
            raise ValueError(f"{self.name or 'dataset'}: {len(self.x)} images but labels of shape {self.y.shape}")
        self.n_classes = int(self.n_classes)
        bad = (self.y < 0) | (self.y >= self.n_classes)
        if bad.any():
            raise ValueError(f"{self.name or 'dataset'}: label {int(self.y[bad][0])} outside the "
                             f"{self.n_classes} classes")

    def __len__(self):
        return len(self.x)

    @property
    def shape(self):
        return tuple(self.x.shape[1:])

    def subset(self, idx, name=None) -> "Dataset":
        return Dataset(self.x[idx], self.y[idx], self.n_classes, name or self.name,
                       classes=list(self.classes))

    def channel_stats(self):
        """Per-channel mean and std in the units deform normalises (uint8 / 255)."""
        x = self.x.astype(np.float64)
        if self.x.dtype == np.uint8:
            x /= 255.0
        mean = x.mean(axis=(0, 2, 3))
        std = x.std(axis=(0, 2, 3))
        return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)
