"""The datasets: the interface every loader returns (`Dataset` of two `Split`s) and the registry, a
dataset being one module defining `DATASET = Declaration(...)` (docs/configs.md)."""

import dataclasses
import hashlib
import importlib
import os
import pkgutil
from collections.abc import Callable
from typing import Any

import numpy as np

TASKS = ('classification', 'multilabel')
# Per-channel normalisation applied on device: x = (uint8 / 255 - mean) / std.
NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
  'half': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # the reference study (transforms.Normalize(.5, .5))
  'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # torchvision pretrained weights
}


class DataError(ValueError):
  """The data a config names cannot be had: one line, the fix included, before any compute."""


@dataclasses.dataclass(frozen=True)
class Split:
  """One split: `images` uint8 [N, H, W, C] (array or memmap), `labels` int32 [N] or [N, K]."""

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
  """What a loader returns: the splits, the task ('classification' or 'multilabel'), the classes (or
  labels), and JSON-serialisable facts (`info`) for the run's record."""

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


DataConfig = Any  # config.data: its ConfigDict, or a plain mapping of its fields (the tests')


@dataclasses.dataclass(frozen=True)
class Declaration:
  """What a dataset module declares, read before any data is loaded: sizes, channels, labels, its
  loader, the tasks and splits it takes, the problems found without reading data."""

  name: str
  images: int
  channels: int
  split_sizes: Callable[[DataConfig], tuple[int, int]]
  labels: Callable[[DataConfig], tuple[int, str, tuple[int, ...]]]
  load: Callable[[Any], Dataset]
  tasks: tuple[str, ...] = ()
  splits: tuple[str, ...] = ()
  problems: Callable[[DataConfig], list[str]] | None = None


def _module(name):
  """The module input_pipeline.<name>, or None where there is none (or it declares no dataset)."""
  if not (isinstance(name, str) and name.isidentifier()):
    return None
  try:
    module = importlib.import_module(f'{__name__}.{name}')
  except ModuleNotFoundError as e:
    if e.name != f'{__name__}.{name}':
      raise  # the dataset module exists, but an import it makes fails: say so
    return None
  return module if isinstance(getattr(module, 'DATASET', None), Declaration) else None


def names() -> list[str]:
  """The names of every dataset module in input_pipeline/, sorted (each module is imported)."""
  found = [info.name for info in pkgutil.iter_modules(__path__)]
  return sorted(name for name in found if _module(name) is not None)


def get(name: str) -> Declaration:
  """The Declaration of dataset `name`; DataError (one line) when no module declares it."""
  module = _module(name)
  if module is None:
    raise DataError(
      f'config.data.name must be one of {tuple(names())} (a module '
      f'input_pipeline/<name>.py that declares DATASET), got {name!r}'
    )
  if module.DATASET.name != name:
    raise DataError(
      f'input_pipeline/{name}.py declares the dataset {module.DATASET.name!r}: '
      'a dataset module declares its own name'
    )
  return module.DATASET


def load(config) -> Dataset:
  """The Dataset of config.data.name, its data loaded by its module's loader."""
  return get(config.data.name).load(config)


def _zeros(count, image_shape, label_shape):
  images = np.broadcast_to(np.zeros((), np.uint8), (count,) + image_shape)
  return Split(images, np.broadcast_to(np.zeros((), np.int32), (count,) + label_shape))


def declared(config) -> Dataset:
  """The Dataset a run of `config` would load, without reading data: the facts from the Declaration,
  the splits zero-stride views of one zero (a TPU program compiled where the data are not)."""
  dataset = get(config.data.name)
  train, test = dataset.split_sizes(config.data)
  num_classes, task, label_shape = dataset.labels(config.data)
  size = int(config.data.image_size)
  image_shape = (size, size, dataset.channels)
  return Dataset(
    name=dataset.name,
    train=_zeros(train, image_shape, label_shape),
    test=_zeros(test, image_shape, label_shape),
    num_classes=num_classes,
    task=task,
    info={'declared': True, 'train_size': train, 'test_size': test},
  )


def normalization_constants(name: str, channels: int) -> tuple[np.ndarray, np.ndarray]:
  """(mean, std) float32 arrays of length `channels` of normalisation `name` (grey: the mean)."""
  mean, std = NORMALIZATIONS[name]
  if channels == 1:
    mean, std = (float(np.mean(mean)),), (float(np.mean(std)),)
  return np.asarray(mean, np.float32), np.asarray(std, np.float32)


def fingerprint(values: Any) -> str:
  """A short, order-independent hash of a collection of strings or ints (e.g. test file names)."""
  digest = hashlib.sha256()
  for value in sorted(str(v) for v in values):
    digest.update(value.encode())
    digest.update(b'\0')
  return digest.hexdigest()[:16]


def host_memory() -> int | None:
  """This machine's physical memory in bytes (None where the OS does not say)."""
  try:
    return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None
