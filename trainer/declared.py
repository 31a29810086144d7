"""The dataset a config would load, declared from the config and the dataset's full size, without
reading any data: what a run is built from on a host that does not hold the data (the TPU program
compiled ahead of time, sweeps/preflight.py, through trainer/run.py `build`).

Every fact a step's program depends on comes from here: image size and channels, the class count
and task, and the split sizes (the steps of an epoch, the evaluation's batches). The images and
labels are zero-stride numpy views of one zero (`np.broadcast_to`): shaped like the real splits,
taking no memory, never read.

  digits  scikit-learn's 1,797 8x8 grey images, 10 classes; the test split is
          ceil(1797 x data.test_fraction) images (scikit-learn's train_test_split rule, as
          input_pipeline/digits.py splits), the rest trains.
  celeba  202,599 RGB images; task 'identity': 10,177 classes (every identity of full CelebA),
          'attributes': 40 binary labels. Split 'official': partitions 0 and 2 of
          list_eval_partition.txt, 162,770 and 19,962 images (CelebA's published partition);
          'per_identity': each identity splits by round-half-up of n x test_fraction
          (input_pipeline/celeba_files.py), declared here as round-half-up of 202,599 x
          test_fraction (the per-identity rounding moves it by at most one image per identity).
"""

import math

import numpy as np

from input_pipeline import base
from trainer import validation

CHANNELS = {'digits': 1, 'celeba': 3}
DIGITS_CLASSES = 10
CELEBA_IDENTITIES = 10177
CELEBA_ATTRIBUTES = 40
CELEBA_OFFICIAL = {'train': 162770, 'test': 19962}  # partitions 0 and 2


def split_sizes(config):
  """(train images, test images) a run of `config` would load (module doc)."""
  data = config.data
  total = validation.DATASET_IMAGES[data.name]
  if data.name == 'digits':
    test = math.ceil(total * float(data.test_fraction))
  elif data.split == 'official':
    return CELEBA_OFFICIAL['train'], CELEBA_OFFICIAL['test']
  else:
    test = math.floor(total * float(data.test_fraction) + 0.5)
  return total - test, test


def labels_of(config):
  """(num_classes, task, label shape per example) of `config`'s dataset and task."""
  if config.data.name == 'digits':
    return DIGITS_CLASSES, 'classification', ()
  if config.data.task == 'attributes':
    return CELEBA_ATTRIBUTES, 'multilabel', (CELEBA_ATTRIBUTES,)
  return CELEBA_IDENTITIES, 'classification', ()


def _split(count, image_shape, label_shape):
  images = np.broadcast_to(np.zeros((), np.uint8), (count,) + image_shape)
  return base.Split(images, np.broadcast_to(np.zeros((), np.int32), (count,) + label_shape))


def dataset(config):
  """The `base.Dataset` of `config` with data-less splits (module doc)."""
  name = config.data.name
  if name not in CHANNELS:
    raise validation.ConfigError(f'config.data.name must be one of {tuple(CHANNELS)}, got '
                                 f'{name!r}')
  size = int(config.data.image_size)
  train, test = split_sizes(config)
  num_classes, task, label_shape = labels_of(config)
  image_shape = (size, size, CHANNELS[name])
  return base.Dataset(name=name, train=_split(train, image_shape, label_shape),
                      test=_split(test, image_shape, label_shape), num_classes=num_classes,
                      task=task, info={'declared': True, 'train_size': train, 'test_size': test})
