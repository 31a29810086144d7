"""The embedded default: scikit-learn's `load_digits` (1,797 real 8x8 images, 10 classes)."""

import math

import numpy as np
from PIL import Image

import input_pipeline
from input_pipeline import DataError, Dataset, Declaration, Split

IMAGES = 1797
CLASSES = 10


def split_sizes(data):
  """(train, test) images: ceil(IMAGES x data.test_fraction) test, as train_test_split rounds."""
  test = math.ceil(IMAGES * float(data.test_fraction))
  return IMAGES - test, test


def _resize(images, size):
  if images.shape[1] == size:
    return images
  return np.stack(
    [np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR)) for im in images]
  )


def load(config):
  """The digits `Dataset` for `config.data` (image_size, test_fraction, split_seed)."""
  # scikit-learn loads with the data, not with a check
  from sklearn import datasets as sk_datasets
  from sklearn import model_selection

  digits = sk_datasets.load_digits()
  size = int(config.data.image_size)
  need, host = len(digits.images) * size * size, input_pipeline.host_memory()
  if host and need > host / 2:  # the resized images are held in memory, on the host
    raise DataError(
      f'config.data.image_size={size}: the {len(digits.images)} digits resized to '
      f'{size}x{size} take {need / 2**30:.1f} GiB of memory, over half of the '
      f'{host / 2**30:.1f} GiB this machine has: use a smaller '
      'config.data.image_size (the digits are 8x8 images)'
    )
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # [1797, 8, 8]
  images = _resize(images, size)[..., None]
  labels = digits.target.astype(np.int32)
  index = np.arange(len(labels))
  train_idx, test_idx = model_selection.train_test_split(
    index,
    test_size=float(config.data.test_fraction),
    stratify=labels,
    random_state=int(config.data.split_seed),
  )
  train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
  info = {
    'train_size': len(train_idx),
    'test_size': len(test_idx),
    'split_fingerprint': input_pipeline.fingerprint(test_idx.tolist()),
    'split_seed': int(config.data.split_seed),
  }
  return Dataset(
    name='digits',
    train=Split(images[train_idx], labels[train_idx]),
    test=Split(images[test_idx], labels[test_idx]),
    num_classes=CLASSES,
    task='classification',
    info=info,
  )


DATASET = Declaration(
  name='digits',
  images=IMAGES,
  channels=1,
  split_sizes=split_sizes,
  labels=lambda data: (CLASSES, 'classification', ()),
  load=load,
)
