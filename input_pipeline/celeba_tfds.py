"""TFDS `celeb_a` 2.1.0 prepared offline from the five local files, and read back as JPEG bytes."""

import functools
import json
import os
import re
import socket
import types
import zipfile

import numpy as np
from absl import logging
from etils import epath

from input_pipeline import DataError, celeba

VERSION = '2.1.0'
PARTITION_SPLITS = ('train', 'validation', 'test')  # official partitions 0, 1, 2


def import_tfds():
  """tensorflow_datasets with TensorFlow forced onto the CPU and quiet."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import tensorflow as tf

  tf.config.set_visible_devices([], 'GPU')
  tf.get_logger().setLevel('ERROR')
  import tensorflow_datasets as tfds

  tfds.disable_progress_bar()
  return tfds


def missing_tfds(field):
  """The one line for a preparation (asked for by `field`) without tensorflow-datasets installed."""
  return (
    f'{field}: preparing CelebA needs tensorflow-datasets, which is not installed: '
    'pip install -r requirements-celeba.txt'
  )


def require_tfds(field):
  """import_tfds(), or a DataError with the one line `missing_tfds(field)`."""
  try:
    return import_tfds()
  except ImportError as e:
    raise DataError(missing_tfds(field)) from e


def _builder_class():
  """The unregistered local subclass of the installed `celeb_a` builder."""
  from tensorflow_datasets.datasets.celeb_a import celeb_a_dataset_builder as upstream

  urls = {
    upstream.IMG_ALIGNED_DATA: celeba.ZIP,
    upstream.EVAL_LIST: celeba.PARTITION,
    upstream.ATTR_DATA: celeba.ATTR,
    upstream.LANDMARKS_DATA: celeba.LANDMARKS,
    upstream.IDENTITY_DATA: celeba.IDENTITY,
  }

  class LocalFiles:
    """Stands in for the download manager: URLs map to files in manual_dir, archives are read."""

    def __init__(self, manual_dir):
      self._dir = manual_dir

    def download(self, url_or_urls):
      return {k: epath.Path(self._dir) / urls[u] for k, u in url_or_urls.items()}

    def iter_archive(self, path):
      zf = zipfile.ZipFile(os.fspath(path))  # read lazily; closed with the last member
      for name, info in celeba.members_of(zf).items():
        # Read when the builder writes the record (tfds.features.Image calls read() on it).
        member = types.SimpleNamespace(read=functools.partial(zf.read, info))
        yield f'{celeba.MEMBER_DIR}/{name}', member

  class _LocalCelebA(upstream.Builder, skip_registration=True):
    name = 'celeb_a'
    # The upstream module's path: its README, citation and checksums are found as for the upstream
    # builder (and tfds's own lookup needs `importlib_resources`, which the venv lacks).
    code_path = epath.Path(upstream.__file__)

    def __init__(self, *, manual_files_dir, **kwargs):
      self._manual_files_dir = manual_files_dir
      super().__init__(**kwargs)

    def dataset_info_from_configs(self, **kwargs):
      return super().dataset_info_from_configs(disable_shuffling=True, **kwargs)

    def _log_download_bytes(self):
      # Upstream prints "Downloading and preparing dataset ..." to stdout: nothing is downloaded.
      logging.info(
        'Preparing TFDS celeb_a %s offline from the files in %s into %s (nothing is downloaded)',
        VERSION,
        self._manual_files_dir,
        self.data_dir,
      )

    def _split_generators(self, dl_manager):
      return super()._split_generators(LocalFiles(self._manual_files_dir))

    def _generate_examples(self, *args, **kwargs):
      for index, (_, record) in enumerate(super()._generate_examples(*args, **kwargs)):
        yield record_key(index), record

  return _LocalCelebA


KEY_SHIFT = 108  # record keys index << 108: up to 2**20 records per split


def record_key(index):
  """The TFDS key of the split's record number `index`: increasing, spread over the 128-bit keys."""
  if index >> (128 - KEY_SHIFT):
    raise ValueError(f'celeb_a split has more than {2 ** (128 - KEY_SHIFT)} records')
  return index << KEY_SHIFT


def dataset_dir(tfds_root):
  return os.path.join(tfds_root, 'celeb_a', VERSION)


SOURCE, INDEX = 'celeb_a_source.json', 'celeb_a_index.npz'


def _record_path(tfds_root, name):
  """`name` in the version folder, or beside it where a preparation before atomic ones put it."""
  inside, beside = epath.Path(dataset_dir(tfds_root)) / name, epath.Path(tfds_root) / name
  return beside if not inside.exists() and beside.exists() else inside


def partial_path(path):
  """Where `path` is written before it is renamed into place: `<path>.partial-<host>-<pid>`."""
  return f'{path}.partial-{socket.gethostname()}-{os.getpid()}'


def _alive(pid):
  if pid == os.getpid():
    return False  # this process's own partial is from an attempt that already ended
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True  # or PermissionError: another user's live process


def remove_leftovers(folder):
  """Delete the `*.partial-<host>-<pid>` entries of `folder` whose process on this host is gone;
  warn of other hosts' and of TFDS `incomplete.*` folders."""
  root = epath.Path(folder)
  if not root.is_dir():
    return
  stale = list((root / 'celeb_a').glob('incomplete.*'))
  for entry in root.iterdir():
    match = re.fullmatch(r'.+\.partial-(?:(.+)-)?([0-9]+)', entry.name)
    if not match:
      continue
    host, pid = match.group(1), int(match.group(2))
    if host not in (None, socket.gethostname()):
      stale.append(entry)
    elif not _alive(pid):
      logging.info('Deleting %s, left by a killed CelebA preparation (process %d)', entry, pid)
      entry.rmtree(missing_ok=True)
  for entry in stale:
    logging.warning(
      '%s was left by a killed CelebA preparation (another host, or an older '
      'version): delete it once no process writes it',
      entry,
    )


def read_metadata(tfds_root):
  """The parsed metadata saved beside the prepared dataset (for runs without manual_dir)."""
  with _record_path(tfds_root, INDEX).open('rb') as f:
    with np.load(f) as index:
      return {k: index[k] for k in index.files}


def prepared_source(tfds_root):
  """The source record of the dataset prepared in `tfds_root`, or None if there is none yet."""
  path = _record_path(tfds_root, SOURCE)
  if not (epath.Path(dataset_dir(tfds_root)) / 'dataset_info.json').exists() or not path.exists():
    return None
  return json.loads(path.read_text())


def _check_existing(tfds_root, source):
  """True when tfds_root holds celeb_a prepared from these files; a DataError when another one."""
  existing = prepared_source(tfds_root)
  if existing is not None:
    if existing['source_fingerprint'] != source['source_fingerprint']:
      raise DataError(
        f'config.data.tfds_dir={tfds_root!r} holds celeb_a prepared from other files '
        f'({existing["manual_dir"]}): point config.data.tfds_dir at another folder or delete '
        f'{dataset_dir(tfds_root)}'
      )
    return True
  if (epath.Path(dataset_dir(tfds_root)) / 'dataset_info.json').exists():
    raise DataError(
      f'config.data.tfds_dir={tfds_root!r}: {dataset_dir(tfds_root)} holds a celeb_a '
      f"without this project's {SOURCE} (prepared by another tool, or by an older "
      'version killed before finishing): delete that folder to prepare it again'
    )
  return False


def prepare(manual_dir, tfds_root, source, meta):
  """Prepare celeb_a into `tfds_root` once, atomically; reuse one prepared from the same files."""
  if _check_existing(tfds_root, source):
    return False
  remove_leftovers(tfds_root)
  tfds = import_tfds()
  partial = partial_path(os.path.join(tfds_root, 'celeb_a'))
  epath.Path(partial).rmtree(missing_ok=True)
  try:
    builder = _builder_class()(manual_files_dir=manual_dir, data_dir=partial)
    builder.download_and_prepare(
      download_dir=os.path.join(partial, 'downloads'),
      download_config=tfds.download.DownloadConfig(try_download_gcs=False),
    )
    done = epath.Path(dataset_dir(partial))
    with (done / INDEX).open('wb') as f:
      np.savez(f, **meta)
    (done / SOURCE).write_text(json.dumps(source, indent=1))
    epath.Path(dataset_dir(tfds_root)).parent.mkdir(parents=True, exist_ok=True)
    try:
      done.rename(dataset_dir(tfds_root))  # the step that makes it prepared
    except OSError:  # another host or cache_dir finished first: keep theirs if it is the same
      if not _check_existing(tfds_root, source):
        raise
  finally:
    epath.Path(partial).rmtree(missing_ok=True)
  return True


def iter_records(tfds_root, partition):
  """(JPEG bytes, identity) of official `partition` in record order (= sorted file names)."""
  tfds = import_tfds()
  builder = tfds.builder_from_directory(dataset_dir(tfds_root))
  ds = builder.as_dataset(
    split=PARTITION_SPLITS[partition],
    shuffle_files=False,
    decoders={'image': tfds.decode.SkipDecoding()},
    read_config=tfds.ReadConfig(interleave_cycle_length=1),
  )
  for example in tfds.as_numpy(ds):
    yield example['image'], int(example['identity']['Identity_No'])
