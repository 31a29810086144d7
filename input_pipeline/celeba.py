"""CelebA: the five official files (checked, parsed, fingerprinted), the splits, the decoded uint8
cache (built once, atomically, from TFDS celeb_a: celeba_tfds.py), the loader, its Declaration."""

import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import functools
import glob
import hashlib
import importlib.util
import io
import json
import math
import os
import re
import shutil
import warnings
import zipfile

import numpy as np
from absl import logging
from PIL import Image

import input_pipeline
from input_pipeline import DataError, Dataset, Declaration, Split, celeba_tfds

CELEBA_PAGE = 'https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html'
ZIP = 'img_align_celeba.zip'
MEMBER_DIR = 'img_align_celeba'  # the images are the zip's members img_align_celeba/<name>.jpg
PARTITION = 'list_eval_partition.txt'
ATTR = 'list_attr_celeba.txt'
LANDMARKS = 'list_landmarks_align_celeba.txt'
IDENTITY = 'identity_CelebA.txt'
FILES = (ZIP, PARTITION, ATTR, LANDMARKS, IDENTITY)
# Sizes of the official files (tensorflow_datasets/datasets/celeb_a/checksums.tsv).
OFFICIAL_SIZES = {
  ZIP: 1443490838,
  PARTITION: 2836386,
  ATTR: 26721026,
  LANDMARKS: 12156055,
  IDENTITY: 3424458,
}
ATTR_NAMES = (
  '5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose '
  'Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee '
  'Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard '
  'Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair '
  'Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young'
).split()
LANDMARK_NAMES = (
  'lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y '
  'rightmouth_x rightmouth_y'
).split()


def _bad(file_name, problem):
  return DataError(
    f'config.data.manual_dir: {file_name} {problem}; replace it with the official '
    f'file from {CELEBA_PAGE}'
  )


def check_present(manual_dir):
  """One error listing every missing file (and where CelebA is obtained), before any work."""
  if not manual_dir:
    raise DataError(
      f'config.data.manual_dir is empty: set it to a folder holding {", ".join(FILES)} '
      f'(CelebA is obtained from {CELEBA_PAGE}; "Align&Cropped Images" and "Anno")'
    )
  missing = [f for f in FILES if not os.path.isfile(os.path.join(manual_dir, f))]
  if missing:
    raise FileNotFoundError(
      f'config.data.manual_dir={manual_dir!r} lacks {", ".join(missing)}: '
      f'download them from the official CelebA page {CELEBA_PAGE} and put all '
      f'five files ({", ".join(FILES)}) in that folder'
    )


def _rows(path, header_lines, columns, file_name):
  """Rows of a whitespace table as (names, int array [N, columns]), checking shape and count."""
  with open(path) as f:
    lines = f.read().splitlines()
  head, body = lines[:header_lines], lines[header_lines:]
  if len(head) < header_lines:
    raise _bad(file_name, 'is empty or lacks its header')
  parts = [line.split(None, 1) for line in body]
  for number, part in enumerate(parts, header_lines + 1):
    if len(part) != 2 or not part[0].endswith('.jpg') or len(part[1].split()) != columns:
      raise _bad(
        file_name,
        f'line {number} is not a name and {columns} numbers (truncated or not the official file?)',
      )
  try:  # fast: one C parse of every value (numpy >= 2.4 raises on a non-integer, older warned)
    with warnings.catch_warnings():
      warnings.simplefilter('error', DeprecationWarning)
      text = ' '.join(part[1] for part in parts)
      array = np.fromstring(text, dtype=np.int64, sep=' ') if parts else np.zeros(0, np.int64)
  except (ValueError, DeprecationWarning):
    array = None
  if array is None or array.size != len(parts) * columns:
    for number, (_, values) in enumerate(parts, header_lines + 1):  # name the first bad value
      for value in values.split():
        if not re.fullmatch(r'[-+]?[0-9]+', value):
          raise _bad(file_name, f'line {number} holds {value!r}, not an integer')
    raise _bad(file_name, 'holds a value that is not an integer')
  names = [part[0] for part in parts]
  return head, np.asarray(names), array.reshape(len(parts), columns)


def _counted(manual_dir, file_name, headings):
  """A file with a count line and a heading line (attributes, landmarks)."""
  head, names, values = _rows(os.path.join(manual_dir, file_name), 2, len(headings), file_name)
  if not head[0].strip().isdigit():
    raise _bad(file_name, f'starts with {head[0][:40]!r}, not the row count')
  if head[1].split() != list(headings):
    raise _bad(file_name, 'has unexpected column names on line 2')
  if int(head[0]) != len(names):
    raise _bad(file_name, f'declares {int(head[0])} rows but has {len(names)} (truncated?)')
  return names, values


def _by_name(reference, names, values, file_name):
  """`values` reordered to the sorted `reference` names; every name must be there exactly once."""
  order = np.argsort(names, kind='stable')
  names, values = names[order], values[order]
  if len(names) != len(reference) or not np.array_equal(names, reference):
    missing = np.setdiff1d(reference, names)
    extra = np.setdiff1d(names, reference)
    raise _bad(
      file_name,
      f'lists other images than {PARTITION}: {len(missing)} missing '
      f'(e.g. {missing[:3].tolist()}), {len(extra)} extra or repeated '
      f'(e.g. {extra[:3].tolist()}) (truncated?)',
    )
  return values


def zip_members(manual_dir):
  """{file name: ZipInfo} of the images in img_align_celeba.zip; a truncated zip is an error."""
  try:
    with zipfile.ZipFile(os.path.join(manual_dir, ZIP)) as zf:
      return members_of(zf)
  except (zipfile.BadZipFile, OSError) as e:
    raise _bad(ZIP, f'is not a readable zip ({e}; truncated download?)') from e


def members_of(zf):
  """{file name: ZipInfo} of the images `img_align_celeba/<name>.jpg` of the open zip `zf` (others
  ignored); one name twice is an error naming both entries."""
  members, position = {}, {}
  for index, info in enumerate(zf.infolist()):
    folder, _, name = info.filename.partition('/')
    if folder != MEMBER_DIR or '/' in name or not name.endswith('.jpg'):
      continue
    if name in members:
      raise _bad(
        ZIP,
        f'holds {info.filename} twice (entries {position[name]} and {index}, '
        f'{members[name].file_size} and {info.file_size} bytes)',
      )
    members[name], position[name] = info, index
  return members


def read_metadata(manual_dir):
  """Check and parse the five files: sorted names, partition, identity, attributes (-1/1)."""
  check_present(manual_dir)
  _, names, partition = _rows(os.path.join(manual_dir, PARTITION), 0, 1, PARTITION)
  order = np.argsort(names, kind='stable')
  names, partition = names[order], partition[order, 0]
  if len(names) == 0:
    raise _bad(PARTITION, 'lists no images')
  if len(np.unique(names)) != len(names):
    raise _bad(PARTITION, 'lists an image twice')
  if not np.isin(partition, (0, 1, 2)).all():
    raise _bad(PARTITION, 'has a partition other than 0, 1 or 2')
  _, id_names, identity = _rows(os.path.join(manual_dir, IDENTITY), 0, 1, IDENTITY)
  identity = _by_name(names, id_names, identity, IDENTITY)[:, 0]
  attr_names, attributes = _counted(manual_dir, ATTR, ATTR_NAMES)
  attributes = _by_name(names, attr_names, attributes, ATTR)
  if not np.isin(attributes, (-1, 1)).all():
    raise _bad(ATTR, 'has attribute values other than -1 and 1')
  lm_names, landmarks = _counted(manual_dir, LANDMARKS, LANDMARK_NAMES)
  _by_name(names, lm_names, landmarks, LANDMARKS)
  members = zip_members(manual_dir)
  absent = [n for n in names if n not in members]
  if absent:
    raise _bad(ZIP, f'lacks {len(absent)} images listed in {PARTITION} (e.g. {absent[:3]})')
  return {
    'names': names,
    'partition': partition.astype(np.int8),
    'identity': identity.astype(np.int64),
    'attributes': attributes.astype(np.int8),
  }


def source_fingerprint(manual_dir):
  """A hash of the five files: the zip members' names, CRC-32s and sizes, and the txt files'
  bytes."""
  digest = hashlib.sha256()
  for name, info in sorted(zip_members(manual_dir).items()):
    digest.update(f'{name}:{info.CRC}:{info.file_size}\n'.encode())
  for file_name in FILES[1:]:
    with open(os.path.join(manual_dir, file_name), 'rb') as f:
      digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()[:16]


def test_count(n, test_fraction):
  """Test images of an identity with n images: round half up, at most n - 1 (0 for singletons)."""
  return min(max(n - 1, 0), math.floor(n * test_fraction + 0.5))


NATIVE_SHAPE = (218, 178)  # H, W
TASKS = ('identity', 'attributes')
SPLITS = ('per_identity', 'official')
DECODED = {'images': 0}  # images decoded by this process (tests check that a cached load adds none)


IMAGES = 202599  # every aligned image of the five official files
IDENTITIES = 10177
ATTRIBUTES = 40
OFFICIAL = {'train': 162770, 'test': 19962}  # partitions 0 and 2 of list_eval_partition.txt


def split_sizes(data):
  """(train, test) images of `data.split`: the official partition, or per_identity's round-half-up
  of IMAGES x test_fraction (each identity at most one image away)."""
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
  """(manual_dir, tfds_dir, cache_dir) with defaults filled in; one-line errors naming the field."""
  manual_dir = os.path.expanduser(data.manual_dir) if data.manual_dir else ''
  tfds_dir = data.tfds_dir or (os.path.join(manual_dir, 'tfds') if manual_dir else '')
  if not tfds_dir:
    check_present(manual_dir)  # raises: names the five files and the CelebA page
  tfds_dir = tfds_dir if '://' in tfds_dir else os.path.expanduser(tfds_dir)
  cache_dir = data.cache_dir or os.path.join(tfds_dir, 'decoded_cache')
  if '://' in cache_dir:
    raise DataError(
      f'config.data.cache_dir={cache_dir!r} is a bucket path: set it to a local '
      'folder (the decoded cache is memory-mapped)'
    )
  return manual_dir, tfds_dir, os.path.expanduser(cache_dir)


def problems(data):
  """What stops CelebA from loading with `data`, found without reading the images: one line each."""
  try:
    manual_dir, tfds_dir, cache_dir = data_dirs(data)
    prepared = '://' in tfds_dir or celeba_tfds.prepared_source(tfds_dir) is not None
    if manual_dir:
      check_present(manual_dir)
  except (OSError, DataError) as e:
    return [str(e)]
  if not (manual_dir or prepared):
    return [
      f'config.data.tfds_dir={tfds_dir!r} holds no CelebA prepared by this project: set '
      'config.data.manual_dir to the folder holding the five official files'
    ]
  tfds = importlib.util.find_spec('tensorflow_datasets') is not None
  cached = glob.glob(os.path.join(glob.escape(cache_dir), '*', 'done.json'))  # a finished cache
  if not (prepared or tfds or cached):
    return [celeba_tfds.missing_tfds(f'config.data.manual_dir={manual_dir!r}')]
  return []


def _source(manual_dir, tfds_dir):
  """(metadata, source record): from the five files if given, else from the prepared tfds_dir."""
  if manual_dir:
    meta = read_metadata(manual_dir)
    source = {
      'source_fingerprint': source_fingerprint(manual_dir),
      'official_files': all(  # the official byte sizes: this is the real CelebA
        os.path.getsize(os.path.join(manual_dir, f)) == s for f, s in OFFICIAL_SIZES.items()
      ),
      'manual_dir': os.path.abspath(manual_dir),
      'num_images': len(meta['names']),
    }
    return meta, source
  source = celeba_tfds.prepared_source(tfds_dir)
  if source is None:
    check_present(manual_dir)  # raises: says what to download and where to put it
  return celeba_tfds.read_metadata(tfds_dir), source


def _split(data, meta):
  """(train rows, test rows) into the sorted metadata arrays."""
  if data.split == 'official':  # partition 0 trains, 2 tests (1, validation, unused)
    return np.flatnonzero(meta['partition'] == 0), np.flatnonzero(meta['partition'] == 2)
  names, identity = meta['names'], meta['identity']  # each identity split exactly (docs/celeba.md)
  hashes = [hashlib.sha256(f'{int(data.split_seed)}:{n}'.encode()).hexdigest() for n in names]
  keys = np.asarray([int(h[:16], 16) for h in hashes], dtype=np.uint64)
  order = np.lexsort((np.argsort(np.argsort(names, kind='stable')), keys, identity))
  _, starts, counts = np.unique(identity[order], return_index=True, return_counts=True)
  test = np.zeros(len(names), bool)
  for start, count in zip(starts, counts, strict=True):
    test[order[start : start + test_count(int(count), float(data.test_fraction))]] = True
  return np.flatnonzero(~test), np.flatnonzero(test)


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
    raise DataError(
      f'CelebA image {name} in {ZIP} cannot be used ({e}): replace '
      f'config.data.manual_dir/{ZIP} with the official file from {CELEBA_PAGE}'
    ) from e


def _decode_into(records, meta, targets, outputs, size, where, num_threads=None):
  """Decode each record with a target once: targets[row] = (split name, index) or None,
  outputs[split name] = (file descriptor, offset of image 0)."""
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
          raise DataError(
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
        raise DataError(
          f'{where} has {count} records in partition {partition}, not '
          f'{len(part_rows)}: delete its celeb_a folder'
        )


def _decode_to(fd, offset, jpeg, size, name):
  data = decode(jpeg, size, name).tobytes()
  if os.pwrite(fd, data, offset) != len(data):
    raise OSError(errno.ENOSPC, 'short write to the decoded cache (disk full?)')
  DECODED['images'] += 1


def write_cache(folder, rows, meta, size, records, where):
  """Decode the images of `rows` ({split name: metadata rows}) into `folder`/<split>.npy."""
  targets = [None] * len(meta['names'])
  outputs = {}
  try:
    for split_name, split_rows in rows.items():  # an empty .npy each, sparse until written
      path, shape = os.path.join(folder, f'{split_name}.npy'), (len(split_rows), size, size, 3)
      with open(path, 'wb') as f:
        np.lib.format.write_array_header_1_0(
          f, {'descr': '|u1', 'fortran_order': False, 'shape': shape}
        )
        f.truncate(f.tell() + math.prod(shape))
        outputs[split_name] = os.open(path, os.O_WRONLY), f.tell()
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
  """Hold `<cache_dir>/.prepare.lock` exclusively: one process at a time prepares and decodes."""
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


def _build_cache(path, manual_dir, tfds_dir, source, meta, rows, size):
  """Prepare TFDS if needed, then decode the splits into `path` once, atomically (a partial folder
  renamed when complete)."""
  cache_dir = os.path.dirname(path)
  celeba_tfds.remove_leftovers(cache_dir)
  needed, free = sum(map(len, rows.values())) * size * size * 3, shutil.disk_usage(cache_dir).free
  if free < needed:  # refused before any work
    raise DataError(
      f'config.data.cache_dir={cache_dir!r}: the decoded cache needs '
      f'{needed / 2**20:,.1f} MiB and that disk has {free / 2**20:,.1f} MiB free: '
      'free space there or set config.data.cache_dir to a larger local disk'
    )
  if manual_dir:
    celeba_tfds.prepare(manual_dir, tfds_dir, source, meta)
  tmp = celeba_tfds.partial_path(path)
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    records = functools.partial(celeba_tfds.iter_records, tfds_dir)
    write_cache(tmp, rows, meta, size, records, f'config.data.tfds_dir={tfds_dir!r}')
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


def load(config):
  """The CelebA `Dataset` for `config.data` (see the module docstring)."""
  data = config.data
  manual_dir, tfds_dir, cache_dir = data_dirs(data)
  meta, source = _source(manual_dir, tfds_dir)
  train, test = _split(data, meta)
  size = int(data.image_size)
  split_fp = input_pipeline.fingerprint(meta['names'][test].tolist())
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
  if data.task == 'attributes':
    labels = (meta['attributes'] > 0).astype(np.int32)
    num_classes, task = labels.shape[1], 'multilabel'
    label_info = {'label_rule': 'attributes: -1 -> 0, 1 -> 1', 'attribute_names': ATTR_NAMES}
  else:
    ids = np.unique(meta['identity'][train])
    unseen = np.setdiff1d(meta['identity'][test], ids)
    if len(unseen):
      raise DataError(
        f'{len(unseen)} test identities never appear in training (official partitions '
        "are identity-disjoint): use config.data.split='per_identity' for task identity"
      )
    labels = np.searchsorted(ids, meta['identity']).astype(np.int32)
    num_classes, task = len(ids), 'classification'
    label_info = {'label_rule': 'rank of the identity id among the training ids'}
    if np.array_equal(ids, np.arange(1, len(ids) + 1)):
      label_info['label_rule'] += ' (= identity - 1 here)'
    else:
      label_info['identity_ids'] = ids.tolist()  # label k is CelebA identity identity_ids[k]
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
  return Dataset(
    name='celeba',
    train=Split(images['train'], labels[train]),
    test=Split(images['test'], labels[test]),
    num_classes=num_classes,
    task=task,
    info=info,
  )


DATASET = Declaration(
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
