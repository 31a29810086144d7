"""The dataset interface every input pipeline returns.

A dataset is two in-memory (or memory-mapped) splits of uint8 NHWC images with integer labels,
plus the facts the run's results must record. Normalisation and augmentation happen on the device
inside the jitted step (trainer/steps.py), so the host only gathers uint8 rows: cheap, exact, and
identical on every backend. See docs/configs.md ("Adding a dataset").
"""

import dataclasses
import hashlib
import os
from typing import Any

import numpy as np

TASKS = ('classification', 'multilabel')

# Per-channel normalisation applied on device: x = (uint8 / 255 - mean) / std.
NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
  'half': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # the reference study (transforms.Normalize(.5, .5))
  'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # torchvision pretrained weights
}


@dataclasses.dataclass(frozen=True)
class Split:
  """One split: `images` uint8 [N, H, W, C] (np.ndarray or np.memmap), `labels` int32 [N] or
  [N, K]."""

  images: np.ndarray
  labels: np.ndarray

  def __post_init__(self) -> None:
    if self.images.dtype != np.uint8 or self.images.ndim != 4:
      raise ValueError(
        f'images must be uint8 [N,H,W,C], got {self.images.dtype} {self.images.shape}'
      )
    if len(self.images) != len(self.labels):
      raise ValueError(f'{len(self.images)} images but {len(self.labels)} labels')

  def __len__(self) -> int:
    return len(self.images)


@dataclasses.dataclass(frozen=True)
class Dataset:
  """What a dataset's loader returns (input_pipeline/registry.py `load`).

  task: 'classification' (int labels [N], softmax cross-entropy, top-1 accuracy) or 'multilabel'
    (0/1 labels [N, K], sigmoid cross-entropy, mean per-label accuracy).
  num_classes: softmax classes, or K labels for 'multilabel'.
  info: JSON-serialisable facts recorded in the run's results (sizes, split fingerprint, ...).
  """

  name: str
  train: Split
  test: Split
  num_classes: int
  task: str = 'classification'
  info: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self) -> None:
    if self.task not in TASKS:
      raise ValueError(f'task must be one of {TASKS}, got {self.task!r}')

  @property
  def image_shape(self) -> tuple[int, ...]:
    """(H, W, C) of every image."""
    return tuple(self.train.images.shape[1:])


def normalization_constants(name: str, channels: int) -> tuple[np.ndarray, np.ndarray]:
  """(mean, std) float32 arrays of length `channels` for a normalisation preset name."""
  if name not in NORMALIZATIONS:
    raise ValueError(
      f'config.data.normalization must be one of {sorted(NORMALIZATIONS)}, got {name!r}'
    )
  mean, std = NORMALIZATIONS[name]
  if channels == 1:  # grayscale: the mean of the per-channel constants
    mean, std = (float(np.mean(mean)),), (float(np.mean(std)),)
  return np.asarray(mean, np.float32), np.asarray(std, np.float32)


def fingerprint(values):
  """A short, order-independent hash of a collection of strings or ints (e.g. test file names)."""
  digest = hashlib.sha256()
  for value in sorted(str(v) for v in values):
    digest.update(value.encode())
    digest.update(b'\0')
  return digest.hexdigest()[:16]


def host_memory():
  """This machine's physical memory in bytes (None where the OS does not say)."""
  try:
    return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None
