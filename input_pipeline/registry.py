"""The datasets a config may name: each declares itself in its own module.

A dataset is one module, `input_pipeline/<name>.py`, defining `DATASET = registry.Declaration(...)`
(its name, sizes, label layout and loader; input_pipeline/digits.py is the short example), plus a
config file that sets `data.name = '<name>'`. Nothing else lists datasets: the config checks
(configs/validation.py), the trainer's loading (trainer/run.py) and the data-less dataset a TPU
program is compiled from (`declared`, for sweeps/preflight.py) all ask this module. A dataset
module keeps its heavy imports inside its loader, so that checking a config loads no data library.
See docs/configs.md ("Adding a dataset").
"""

import dataclasses
import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any, Protocol, TypeAlias

import ml_collections
import numpy as np

import input_pipeline
from input_pipeline import base

# config.data: its ConfigDict, or a plain mapping of its fields (what the tests pass).
DataConfig: TypeAlias = ml_collections.ConfigDict | Mapping[str, Any]


class SplitSizes(Protocol):
  """config.data -> (train images, test images) a run of that config loads."""

  def __call__(self, data: DataConfig, /) -> tuple[int, int]: ...


class Labels(Protocol):
  """config.data -> (num_classes, task, label shape per example); task one of base.TASKS, a
  'multilabel' label's shape is (num_classes,), a 'classification' one's ()."""

  def __call__(self, data: DataConfig, /) -> tuple[int, str, tuple[int, ...]]: ...


class Loader(Protocol):
  """The whole config -> its base.Dataset, the data themselves (imports its libraries when
  called); raises FileNotFoundError or ValueError (one line first) when the data cannot be had."""

  def __call__(self, config: ml_collections.ConfigDict, /) -> base.Dataset: ...


class Problems(Protocol):
  """config.data -> [one line per problem] that would stop the loader, found without reading the
  data; [] when none."""

  def __call__(self, data: DataConfig, /) -> list[str]: ...


@dataclasses.dataclass(frozen=True)
class Declaration:
  """What a dataset module declares about itself, read before any data is loaded.

  name: config.data.name, the module's own name.
  images: every image the dataset holds; the training split is about (1 - data.test_fraction) of
    it, which bounds an epoch's steps before any data loads.
  channels: image channels (1 grey, 3 RGB).
  split_sizes: config.data -> (train images, test images) a run of that config loads.
  labels: config.data -> (num_classes, task, label shape per example); task as base.TASKS,
    'multilabel' labels have shape (num_classes,).
  load: config -> base.Dataset, the data themselves (imports its libraries when called).
  tasks, splits: the values config.data.task and config.data.split may take; () when the dataset
    ignores the field.
  problems: config.data -> [one line per problem] that would stop `load`, found without reading
    the data (the sweep asks before it launches a run: sweeps/checks.py); None: none to look for.
  """

  name: str
  images: int
  channels: int
  split_sizes: SplitSizes
  labels: Labels
  load: Loader
  tasks: tuple[str, ...] = ()
  splits: tuple[str, ...] = ()
  problems: Problems | None = None


def _module(name):
  """The module input_pipeline.<name>, or None where there is none (or it declares no dataset)."""
  if not (isinstance(name, str) and name.isidentifier()):
    return None
  try:
    module = importlib.import_module(f'input_pipeline.{name}')
  except ModuleNotFoundError as e:
    if e.name != f'input_pipeline.{name}':
      raise  # the dataset module exists, but an import it makes fails: say so
    return None
  return module if isinstance(getattr(module, 'DATASET', None), Declaration) else None


def names() -> list[str]:
  """The names of every dataset module in input_pipeline/, sorted (each module is imported)."""
  found = [info.name for info in pkgutil.iter_modules(input_pipeline.__path__)]
  return sorted(name for name in found if _module(name) is not None)


def get(name: str) -> Declaration:
  """The Declaration of dataset `name`.

  Raises: ValueError (one line naming config.data.name and the datasets there are) when no
  module input_pipeline/<name>.py declares a dataset.
  """
  module = _module(name)
  if module is None:
    raise ValueError(
      f'config.data.name must be one of {tuple(names())} (a module '
      f'input_pipeline/<name>.py that declares DATASET), got {name!r}'
    )
  if module.DATASET.name != name:
    raise ValueError(
      f'input_pipeline/{name}.py declares the dataset {module.DATASET.name!r}: '
      'a dataset module declares its own name'
    )
  return module.DATASET


def load(config: ml_collections.ConfigDict) -> base.Dataset:
  """The `base.Dataset` of config.data.name, its data loaded (the dataset module's loader)."""
  return get(config.data.name).load(config)


def _split(count, image_shape, label_shape):
  images = np.broadcast_to(np.zeros((), np.uint8), (count,) + image_shape)
  return base.Split(images, np.broadcast_to(np.zeros((), np.int32), (count,) + label_shape))


def declared(config: ml_collections.ConfigDict) -> base.Dataset:
  """The `base.Dataset` a run of `config` would load, without reading any data: what a run is
  built from on a host that does not hold the data (a TPU program compiled ahead of time).

  Every fact a step's program depends on comes from the dataset's Declaration: the image size and
  channels, the class count and task, the split sizes (an epoch's steps, the evaluation's
  batches). The images and labels are zero-stride numpy views of one zero (`np.broadcast_to`):
  shaped like the real splits, taking no memory, never read.
  """
  dataset = get(config.data.name)
  train, test = dataset.split_sizes(config.data)
  num_classes, task, label_shape = dataset.labels(config.data)
  size = int(config.data.image_size)
  image_shape = (size, size, dataset.channels)
  return base.Dataset(
    name=dataset.name,
    train=_split(train, image_shape, label_shape),
    test=_split(test, image_shape, label_shape),
    num_classes=num_classes,
    task=task,
    info={'declared': True, 'train_size': train, 'test_size': test},
  )
