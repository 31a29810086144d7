"""The embedded default: scikit-learn's `load_digits` (1,797 real 8x8 images, 10 classes), read
from its data file, and its stratified `train_test_split`, draw for draw: by hand because importing
scikit-learn costs 2-5 s of every run (equal to both in tests/unit/test_digits.py)."""

import gzip
import importlib.util
import io
import math
import os

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


def load_digits():
  """(images [1797, 8, 8] float64 in 0..16, labels [1797]) as sklearn.datasets.load_digits."""
  package = importlib.util.find_spec('sklearn')  # found, not imported
  if package is None or not package.submodule_search_locations:
    raise DataError('the digits ship with scikit-learn: pip install scikit-learn')
  path = os.path.join(package.submodule_search_locations[0], 'datasets', 'data', 'digits.csv.gz')
  with gzip.open(path) as f:
    data = np.loadtxt(io.TextIOWrapper(f, encoding='utf-8'), delimiter=',')
  return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def stratified_split(labels, n_test, seed):
  """(train, test) indices, sorted: train_test_split(stratify=labels, random_state=seed)'s sets."""
  rng = np.random.RandomState(seed)
  _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
  members = np.split(np.argsort(inverse, kind='stable'), np.cumsum(counts)[:-1])
  n_i = _approximate_mode(counts, len(labels) - n_test, rng)
  t_i = _approximate_mode(counts - n_i, n_test, rng)
  train, test = [], []
  for i, idx in enumerate(members):
    drawn = idx.take(rng.permutation(counts[i]), mode='clip')
    train.extend(drawn[: n_i[i]])
    test.extend(drawn[n_i[i] : n_i[i] + t_i[i]])
  return np.sort(train), np.sort(test)


def _approximate_mode(counts, draws, rng):
  """scikit-learn's approximate mode of the multivariate hypergeometric, ties drawn from `rng`."""
  continuous = counts / counts.sum() * draws
  floored = np.floor(continuous)
  need, remainder = int(draws - floored.sum()), continuous - floored
  for value in np.sort(np.unique(remainder))[::-1]:
    if need <= 0:
      break
    (inds,) = np.where(remainder == value)
    add = min(len(inds), need)
    floored[rng.choice(inds, size=add, replace=False)] += 1
    need -= add
  return floored.astype(int)


def load(config):
  """The digits `Dataset` for `config.data` (image_size, test_fraction, split_seed)."""
  digits_images, target = load_digits()
  size = int(config.data.image_size)
  need, host = len(digits_images) * size * size, input_pipeline.host_memory()
  if host and need > host / 2:  # the resized images are held in memory, on the host
    raise DataError(
      f'config.data.image_size={size}: the {len(digits_images)} digits resized to '
      f'{size}x{size} take {need / 2**30:.1f} GiB of memory, over half of the '
      f'{host / 2**30:.1f} GiB this machine has: use a smaller '
      'config.data.image_size (the digits are 8x8 images)'
    )
  images = np.round(digits_images * (255.0 / 16.0)).astype(np.uint8)  # [1797, 8, 8]
  images = _resize(images, size)[..., None]
  labels = target.astype(np.int32)
  train_idx, test_idx = stratified_split(
    labels, split_sizes(config.data)[1], int(config.data.split_seed)
  )
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
