"""CelebA through TFDS `celeb_a` 2.1.0, prepared offline from the five official files and decoded
once into a memory-mapped uint8 cache; its Declaration for the dataset registry.

  config.data.manual_dir  the five official files (`celeba_files.FILES`); never fetched
  config.data.tfds_dir    where TFDS celeb_a is prepared once and reused ('' = <manual_dir>/tfds)
  config.data.cache_dir   decoded uint8 images ('' = <tfds_dir>/decoded_cache; must be local)

Tasks ('identity', 'attributes'), splits ('per_identity', 'official'), preprocessing, the cache's
atomic build and its memory: docs/celeba.md.
"""

import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import functools
import importlib.util
import io
import json
import math
import os
import shutil

import numpy as np
from absl import logging
from PIL import Image

from input_pipeline import base, celeba_files, celeba_tfds, registry

NATIVE_SHAPE = (218, 178)  # H, W
TASKS = ('identity', 'attributes')
SPLITS = ('per_identity', 'official')
DECODED = {'images': 0}  # images decoded by this process (tests check that a cached load adds none)


IMAGES = 202599  # every aligned image of the five official files
IDENTITIES = 10177
ATTRIBUTES = 40
OFFICIAL = {'train': 162770, 'test': 19962}  # partitions 0 and 2 of list_eval_partition.txt


def split_sizes(data):
  """(train, test) images of `data.split`: 'official' CelebA's published partition; 'per_identity'
  declared as round-half-up of IMAGES x test_fraction (each identity splits by round-half-up of
  n x test_fraction, celeba_files.split_identity: at most one image per identity away)."""
  if data.split == 'official':
    return OFFICIAL['train'], OFFICIAL['test']
  test = math.floor(IMAGES * float(data.test_fraction) + 0.5)
  return IMAGES - test, test


def labels_of(data):
  """(num_classes, task, label shape): every identity of full CelebA, or its 40 attributes."""
  if data.task == 'attributes':
    return ATTRIBUTES, 'multilabel', (ATTRIBUTES,)
  return IDENTITIES, 'classification', ()


def data_dirs(data):
  """(manual_dir, tfds_dir, cache_dir) with defaults filled in; ValueError (or FileNotFoundError)
  naming the field when none is given or the cache would be on a bucket."""
  manual_dir = os.path.expanduser(data.manual_dir) if data.manual_dir else ''
  tfds_dir = data.tfds_dir or (os.path.join(manual_dir, 'tfds') if manual_dir else '')
  if not tfds_dir:
    celeba_files.check_present(manual_dir)  # raises: names the five files and the CelebA page
  tfds_dir = tfds_dir if '://' in tfds_dir else os.path.expanduser(tfds_dir)
  cache_dir = data.cache_dir or os.path.join(tfds_dir, 'decoded_cache')
  if '://' in cache_dir:
    raise ValueError(
      f'config.data.cache_dir={cache_dir!r} is a bucket path: set it to a local '
      'folder (the decoded cache is memory-mapped)'
    )
  return manual_dir, tfds_dir, os.path.expanduser(cache_dir)


def problems(data):
  """What stops CelebA from loading with `data` (config.data), found without reading the images
  (the sweep's check before it launches a run): one line each."""
  try:
    manual_dir, tfds_dir, cache_dir = data_dirs(data)
  except (OSError, ValueError) as e:
    return [str(e).splitlines()[0]]
  prepared = '://' in tfds_dir or celeba_tfds.prepared_source(tfds_dir) is not None
  if not manual_dir:
    return (
      []
      if prepared
      else [
        f'config.data.tfds_dir={tfds_dir!r} holds no CelebA prepared by this project: set '
        'config.data.manual_dir to the folder holding the five official files'
      ]
    )
  try:
    celeba_files.check_present(manual_dir)
  except (OSError, ValueError) as e:
    return [str(e).splitlines()[0]]
  if not (
    prepared
    or has_decoded_cache(cache_dir)
    or importlib.util.find_spec('tensorflow_datasets') is not None
  ):
    return [celeba_tfds.missing_tfds(f'config.data.manual_dir={manual_dir!r}')]
  return []


def has_decoded_cache(cache_dir):
  """Whether `cache_dir` holds a finished decoded cache (a subfolder with done.json)."""
  if not os.path.isdir(cache_dir):
    return False
  return any(os.path.isfile(os.path.join(cache_dir, d, 'done.json')) for d in os.listdir(cache_dir))


def _source(manual_dir, tfds_dir):
  """(metadata, source record): from the five files if given, else from the prepared tfds_dir."""
  if manual_dir:
    meta = celeba_files.read_metadata(manual_dir)
    source = {
      'source_fingerprint': celeba_files.source_fingerprint(manual_dir),
      'official_files': celeba_files.official_sizes(manual_dir),
      'manual_dir': os.path.abspath(manual_dir),
      'num_images': len(meta['names']),
    }
    return meta, source
  source = celeba_tfds.prepared_source(tfds_dir)
  if source is None:
    celeba_files.check_present(manual_dir)  # raises: says what to download and where to put it
  return celeba_tfds.read_metadata(tfds_dir), source


def _split(data, meta):
  """(train rows, test rows) into the sorted metadata arrays."""
  if data.split == 'official':
    train, test = celeba_files.split_official(meta['partition'])
  else:
    test = celeba_files.split_identity(
      meta['names'], meta['identity'], float(data.test_fraction), int(data.split_seed)
    )
    train = ~test
  return np.flatnonzero(train), np.flatnonzero(test)


def decode(jpeg, size, name):
  """JPEG bytes -> uint8 [size, size, 3]: PIL decode, RGB, bilinear squash (as the reference)."""
  try:
    with Image.open(io.BytesIO(jpeg)) as image:
      image.load()
      if (image.height, image.width) != NATIVE_SHAPE:
        raise ValueError(f'is {image.height}x{image.width}, not the aligned 218x178')
      image = image.convert('RGB')
      if (size, size) != NATIVE_SHAPE:
        image = image.resize((size, size), Image.BILINEAR)
      return np.asarray(image, dtype=np.uint8)
  except Exception as e:
    raise ValueError(
      f'CelebA image {name} in {celeba_files.ZIP} cannot be used ({e}): replace '
      f'config.data.manual_dir/{celeba_files.ZIP} with the official file from '
      f'{celeba_files.CELEBA_PAGE}'
    ) from None


def _decode_into(records, meta, targets, outputs, size, where, num_threads=None):
  """Decode each record that has a target once: targets[row] = (split name, index) or None;
  outputs[split name] = (file descriptor, byte offset of image 0)."""
  threads = num_threads or len(os.sched_getaffinity(0))
  row_bytes = size * size * 3
  partitions = sorted({int(meta['partition'][r]) for r, t in enumerate(targets) if t is not None})
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for partition in partitions:
      part_rows = np.flatnonzero(meta['partition'] == partition)  # = record order (sorted names)
      pending, count = collections.deque(), 0
      for count, (jpeg, identity) in enumerate(records(partition), 1):
        row = part_rows[count - 1] if count <= len(part_rows) else None
        if row is None or identity != meta['identity'][row]:
          raise ValueError(
            f'{where}: record {count - 1} of partition {partition} does not match '
            'the CelebA files: delete its celeb_a folder'
          )
        if targets[row] is not None:
          split_name, index = targets[row]
          fd, offset = outputs[split_name]
          pending.append(
            pool.submit(_decode_to, fd, offset + index * row_bytes, jpeg, size, meta['names'][row])
          )
        while len(pending) >= 4 * threads:  # bounded: at most 4 * threads images in flight
          pending.popleft().result()
      for future in pending:
        future.result()
      if count != len(part_rows):
        raise ValueError(
          f'{where} has {count} records in partition {partition}, not '
          f'{len(part_rows)}: delete its celeb_a folder'
        )


def _decode_to(fd, offset, jpeg, size, name):
  data = decode(jpeg, size, name).tobytes()
  if os.pwrite(fd, data, offset) != len(data):
    raise OSError(errno.ENOSPC, 'short write to the decoded cache (disk full?)')
  DECODED['images'] += 1


def _create_npy(path, count, size):
  """An empty uint8 [count, size, size, 3] .npy (sparse until written): (open fd, data offset)."""
  header = {
    'descr': np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
    'fortran_order': False,
    'shape': (count, size, size, 3),
  }
  with open(path, 'wb') as f:
    np.lib.format.write_array_header_1_0(f, header)
    offset = f.tell()
    f.truncate(offset + count * size * size * 3)
  return os.open(path, os.O_WRONLY), offset


def write_cache(folder, rows, meta, size, records, where):
  """Decode the images of `rows` ({split name: metadata rows}) into `folder`/<split>.npy.

  `records(partition)` yields (JPEG bytes, identity) of an official partition in record order;
  `where` names their source in errors. Each image goes to its place in the file by a positioned
  write (os.pwrite), never through a memory map: mapped pages written count in the process's RSS
  (the whole cache, by the end), written pages do not. At most 4 images per thread are in flight,
  so memory does not grow with the number of images beyond the per-image index (`targets`).
  """
  targets = [None] * len(meta['names'])
  outputs = {}
  try:
    for split_name, split_rows in rows.items():
      outputs[split_name] = _create_npy(
        os.path.join(folder, f'{split_name}.npy'), len(split_rows), size
      )
      for index, row in enumerate(split_rows):
        targets[row] = (split_name, index)
    _decode_into(records, meta, targets, outputs, size, where)
    for fd, _ in outputs.values():
      os.fsync(fd)
  finally:
    for fd, _ in outputs.values():
      os.close(fd)


@contextlib.contextmanager
def preparation_lock(cache_dir):
  """Hold `<cache_dir>/.prepare.lock` exclusively: one process at a time prepares TFDS and decodes.

  The runs of a sweep started together on fresh files (`sweeps.sweep --parallel N`) would
  otherwise all prepare TFDS into one tfds_dir at once (and trip over each other's half-written
  dataset) and all decode the same images. The others wait here, then find the cache built. An
  flock dies with its process, so a killed preparation never leaves a stale lock; it serialises
  processes of one machine (a cache_dir is local), not hosts sharing a network tfds_dir.
  """
  os.makedirs(cache_dir, exist_ok=True)
  with open(os.path.join(cache_dir, '.prepare.lock'), 'a') as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info('Another process is preparing CelebA in %s: waiting for it', cache_dir)
      fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _check_space(cache_dir, needed):
  """Refuse before any work when `cache_dir`'s disk cannot hold the decoded cache."""
  free = shutil.disk_usage(cache_dir).free
  if free < needed:
    raise ValueError(
      f'config.data.cache_dir={cache_dir!r}: the decoded cache needs '
      f'{needed / 2**20:,.1f} MiB and that disk has {free / 2**20:,.1f} MiB free: '
      'free space there or set config.data.cache_dir to a larger local disk'
    )


def _build_cache(path, manual_dir, tfds_dir, source, meta, rows, size):
  """Prepare TFDS if needed, then decode the splits' images into `path` once (atomically: into
  `<path>.partial-<host>-<pid>`, renamed when complete; leftovers of killed builds deleted
  first)."""
  celeba_tfds.remove_leftovers(os.path.dirname(path))
  _check_space(os.path.dirname(path), sum(len(r) for r in rows.values()) * size * size * 3)
  if manual_dir:
    celeba_tfds.prepare(manual_dir, tfds_dir, source, meta)
  tmp = celeba_tfds.partial_path(path)
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    write_cache(
      tmp,
      rows,
      meta,
      size,
      functools.partial(celeba_tfds.iter_records, tfds_dir),
      f'config.data.tfds_dir={tfds_dir!r}',
    )
    with open(os.path.join(tmp, 'done.json'), 'w') as f:
      json.dump({k: len(v) for k, v in rows.items()}, f)
      f.flush()
      os.fsync(f.fileno())
    os.rename(tmp, path)
  except OSError:
    if not os.path.exists(os.path.join(path, 'done.json')):
      raise
  finally:  # removes the partial folder after a failure (and after losing a race to another)
    shutil.rmtree(tmp, ignore_errors=True)


def _labels(task, meta, train, test):
  """(train labels, test labels, num_classes, base task, info) for `task`."""
  if task == 'attributes':
    labels = (meta['attributes'] > 0).astype(np.int32)
    return (
      labels[train],
      labels[test],
      labels.shape[1],
      'multilabel',
      {'label_rule': 'attributes: -1 -> 0, 1 -> 1', 'attribute_names': celeba_files.ATTR_NAMES},
    )
  ids = np.unique(meta['identity'][train])
  unseen = np.setdiff1d(meta['identity'][test], ids)
  if len(unseen):
    raise ValueError(
      f'{len(unseen)} test identities never appear in training (official partitions '
      "are identity-disjoint): use config.data.split='per_identity' for task identity"
    )
  labels = np.searchsorted(ids, meta['identity']).astype(np.int32)
  info = {'label_rule': 'rank of the identity id among the training ids'}
  if np.array_equal(ids, np.arange(1, len(ids) + 1)):
    info['label_rule'] += ' (= identity - 1 here)'
  else:
    info['identity_ids'] = ids.tolist()  # label k is CelebA identity identity_ids[k]
  return labels[train], labels[test], len(ids), 'classification', info


def load(config):
  """The CelebA `Dataset` for `config.data` (see the module docstring)."""
  data = config.data
  manual_dir, tfds_dir, cache_dir = data_dirs(data)
  meta, source = _source(manual_dir, tfds_dir)
  train, test = _split(data, meta)
  size = int(data.image_size)
  split_fp = base.fingerprint(meta['names'][test].tolist())
  key = f'{source["source_fingerprint"]}-{data.split}-{size}px-{split_fp}'
  path = os.path.join(cache_dir, key)
  if not os.path.exists(os.path.join(path, 'done.json')):
    # Preparing and decoding read TFDS: on an install without it, one line before any lock or
    # folder is made.
    celeba_tfds.require_tfds(
      f'config.data.manual_dir={manual_dir!r}'
      if manual_dir
      else f'config.data.tfds_dir={tfds_dir!r}'
    )
    with preparation_lock(cache_dir):
      if not os.path.exists(os.path.join(path, 'done.json')):  # not built while we waited
        _build_cache(path, manual_dir, tfds_dir, source, meta, {'train': train, 'test': test}, size)
  images = {s: np.load(os.path.join(path, f'{s}.npy'), mmap_mode='r') for s in ('train', 'test')}
  train_labels, test_labels, num_classes, task, label_info = _labels(data.task, meta, train, test)
  counts = np.unique(meta['identity'], return_counts=True)[1]
  info = {
    'task': data.task,
    'split': data.split,
    'split_seed': int(data.split_seed),
    'test_fraction': float(data.test_fraction),
    'split_fingerprint': split_fp,
    'train_size': len(train),
    'test_size': len(test),
    'num_images': len(meta['names']),
    'num_identities': len(counts),
    'single_image_identities': int((counts == 1).sum()),
    'source_fingerprint': source['source_fingerprint'],
    'official_files': bool(source.get('official_files', False)),
    'tfds': f'celeb_a:{celeba_tfds.VERSION}',
    'image_size': size,
    'resize': 'PIL bilinear to image_size x image_size, aspect not kept',
    'decoded_cache': path,
    **label_info,
  }
  return base.Dataset(
    name='celeba',
    train=base.Split(images['train'], train_labels),
    test=base.Split(images['test'], test_labels),
    num_classes=num_classes,
    task=task,
    info=info,
  )


DATASET = registry.Declaration(
  name='celeba',
  images=IMAGES,
  channels=3,
  split_sizes=split_sizes,
  labels=labels_of,
  load=load,
  tasks=TASKS,
  splits=SPLITS,
  problems=problems,
)
