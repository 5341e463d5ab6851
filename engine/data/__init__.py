"""Data: readers (digits, image tree, MNIST IDX, CIFAR-10 binary, npz),
on-device deformation and the prefetching loader."""
from .dataset import Dataset, FileDataset
from .deform import DeformConfig
from .loader import Loader
from .readers import FORMATS, load_dataset, detect_format, read_idx

__all__ = ["Dataset", "FileDataset", "DeformConfig", "Loader", "FORMATS", "load_dataset", "detect_format", "read_idx"]
