"""TFDS `celeb_a` 2.1.0 prepared offline from the five local files, and read back as JPEG bytes.

The installed builder's download URLs (Google Drive) are unreachable here, so `_LocalCelebA` is a
thin, unregistered subclass of it with the same name, version and features: its only change is that
`dl_manager.download(...)` answers with the local files in `config.data.manual_dir` instead of
fetching, and that the records keep the builder's generation order (`disable_shuffling`), which is
the file names sorted within each official partition. The upstream `_generate_examples` does the
rest unchanged. Nothing is ever fetched (GCS lookups are off too).

TensorFlow is imported here only, CPU-only and quiet; the GPU machines have no TensorFlow and never
get here once the decoded cache exists.
"""

import json
import os

import numpy as np

from input_pipeline import celeba_files

VERSION = '2.1.0'
PARTITION_SPLITS = ('train', 'validation', 'test')  # official partitions 0, 1, 2


def import_tfds():
  """tensorflow_datasets with TensorFlow forced onto the CPU and quiet."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], 'GPU')
  tf.get_logger().setLevel('ERROR')
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds.disable_progress_bar()
  return tfds


def _builder_class():
  """The unregistered local subclass of the installed `celeb_a` builder."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.datasets.celeb_a import celeb_a_dataset_builder as upstream  # pylint: disable=g-import-not-at-top
  urls = {upstream.IMG_ALIGNED_DATA: celeba_files.ZIP, upstream.EVAL_LIST: celeba_files.PARTITION,
          upstream.ATTR_DATA: celeba_files.ATTR, upstream.LANDMARKS_DATA: celeba_files.LANDMARKS,
          upstream.IDENTITY_DATA: celeba_files.IDENTITY}

  class LocalFiles:
    """Stands in for the download manager: URLs map to files in manual_dir, archives are read."""

    def __init__(self, dl_manager, manual_dir):
      self._dl, self._dir = dl_manager, manual_dir

    def download(self, url_or_urls):
      return {k: epath.Path(self._dir) / urls[u] for k, u in url_or_urls.items()}

    def iter_archive(self, path):
      return self._dl.iter_archive(path)

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

    def _split_generators(self, dl_manager):
      return super()._split_generators(LocalFiles(dl_manager, self._manual_files_dir))

  return _LocalCelebA


def dataset_dir(tfds_root):
  return os.path.join(tfds_root, 'celeb_a', VERSION)


def _source_path(tfds_root):
  return os.path.join(tfds_root, 'celeb_a_source.json')


def _path(path):
  """A local path as is (no etils/TF needed); a bucket path (gs://...) through etils.epath."""
  if '://' not in str(path):
    import pathlib  # pylint: disable=g-import-not-at-top
    return pathlib.Path(path)
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def _index_path(tfds_root):
  return os.path.join(tfds_root, 'celeb_a_index.npz')


def read_metadata(tfds_root):
  """The parsed metadata saved beside the prepared dataset (for runs without manual_dir)."""
  with _path(_index_path(tfds_root)).open('rb') as f:
    with np.load(f) as index:
      return {k: index[k] for k in index.files}


def prepared_source(tfds_root):
  """The source record of the dataset prepared in `tfds_root`, or None if there is none yet."""
  path = _path(_source_path(tfds_root))
  if not (_path(dataset_dir(tfds_root)) / 'dataset_info.json').exists() or not path.exists():
    return None
  return json.loads(path.read_text())


def prepare(manual_dir, tfds_root, source, meta):
  """Prepare celeb_a into `tfds_root` once; reuse it when it came from the same files."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  existing = prepared_source(tfds_root)
  if existing is not None:
    if existing['source_fingerprint'] != source['source_fingerprint']:
      raise ValueError(
          f'config.data.tfds_dir={tfds_root!r} holds celeb_a prepared from other files '
          f'({existing["manual_dir"]}): point config.data.tfds_dir at another folder or delete '
          f'{dataset_dir(tfds_root)} and {_source_path(tfds_root)}')
    return False
  tfds = import_tfds()
  if (epath.Path(dataset_dir(tfds_root)) / 'dataset_info.json').exists():
    raise ValueError(f'config.data.tfds_dir={tfds_root!r} holds a celeb_a not prepared by this '
                     f'project (no {_source_path(tfds_root)}): use another config.data.tfds_dir')
  builder = _builder_class()(manual_files_dir=manual_dir, data_dir=tfds_root)
  builder.download_and_prepare(
      download_dir=os.path.join(tfds_root, 'downloads'),
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  with epath.Path(_index_path(tfds_root)).open('wb') as f:
    np.savez(f, **meta)
  epath.Path(_source_path(tfds_root)).write_text(json.dumps(source, indent=1))  # written last
  return True


def iter_records(tfds_root, partition):
  """(JPEG bytes, identity) of official `partition` in record order (= sorted file names)."""
  tfds = import_tfds()
  builder = tfds.builder_from_directory(dataset_dir(tfds_root))
  ds = builder.as_dataset(
      split=PARTITION_SPLITS[partition], shuffle_files=False,
      decoders={'image': tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(interleave_cycle_length=1))
  for example in tfds.as_numpy(ds):
    yield example['image'], int(example['identity']['Identity_No'])
