"""CelebA pipeline on a generated CelebA-format fixture (CPU), the files it must refuse or name:
missing, truncated and corrupt files, bad values, stray and duplicate zip members, a TFDS folder
of other files, bad config fields, a core install without TFDS."""

import os
import shutil
import sys
import warnings
import zipfile

import numpy as np
import pytest

from configs import validation
from input_pipeline import celeba, celeba_fixture, celeba_tfds
from tests.support.celeba_data import copy_fixture, meta_and_split, smoke_config
from trainer import run


def test_missing_files_listed(tmp_path, fixture_dir):
  with pytest.raises(FileNotFoundError) as error:
    celeba.load(smoke_config(str(tmp_path)))
  message = str(error.value)
  assert all(f in message for f in celeba.FILES) and celeba.CELEBA_PAGE in message
  partial = tmp_path / 'partial'
  shutil.copytree(fixture_dir[0], partial, ignore=shutil.ignore_patterns('tfds'))
  os.remove(partial / celeba.IDENTITY)
  os.remove(partial / celeba.ZIP)
  with pytest.raises(FileNotFoundError, match='lacks img_align_celeba.zip, identity_CelebA.txt:'):
    celeba.load(smoke_config(str(partial)))


def test_core_install_without_tfds_is_one_line_and_leaves_no_lock(
  fixture_dir, dataset, tmp_path, monkeypatch
):
  """Before: a 35-line ModuleNotFoundError traceback from train.py, and <cache_dir>/.prepare.lock
  left behind. Now the sweep check's line, as a ConfigError (train.py: exit 2), nothing made."""
  del dataset  # the fixture's files prepared into its tfds_dir (for the second case)
  target = copy_fixture(fixture_dir, tmp_path)
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # import fails: the core install
  with pytest.raises(validation.ConfigError) as error:
    run.load_dataset(smoke_config(str(target)))
  assert str(error.value) == (
    f'config.data.manual_dir={str(target)!r}: preparing CelebA needs '
    'tensorflow-datasets, which is not installed: pip install -r '
    'requirements-celeba.txt'
  )
  assert sorted(os.listdir(target)) == sorted(celeba.FILES)  # no tfds/, no lock, no cache
  # A prepared tfds_dir whose decoded cache is not built yet needs TFDS to decode, too.
  config = smoke_config(
    '', tfds_dir=os.path.join(fixture_dir[0], 'tfds'), cache_dir=str(tmp_path / 'cache')
  )
  with pytest.raises(validation.ConfigError, match=r"^config.data.tfds_dir='.*': preparing"):
    run.load_dataset(config)
  assert not (tmp_path / 'cache').exists()


def test_truncated_zip_is_an_error(fixture_dir, tmp_path):
  target = copy_fixture(fixture_dir, tmp_path)
  path = target / celeba.ZIP
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(ValueError, match='img_align_celeba.zip is not a readable zip.*truncated'):
    celeba.load(smoke_config(str(target)))


@pytest.mark.parametrize(
  'file_name,pattern',
  [
    (celeba.ATTR, 'list_attr_celeba.txt declares'),
    (celeba.LANDMARKS, 'list_landmarks_align_celeba.txt declares'),
    (celeba.IDENTITY, 'identity_CelebA.txt lists other images'),
  ],
)
def test_truncated_text_file_is_an_error(fixture_dir, tmp_path, file_name, pattern):
  target = copy_fixture(fixture_dir, tmp_path)
  path = target / file_name
  path.write_text(''.join(path.read_text().splitlines(keepends=True)[:-3]))
  with pytest.raises(ValueError, match=pattern):
    celeba.load(smoke_config(str(target)))


def test_bad_attribute_value_is_an_error(fixture_dir, tmp_path):
  target = copy_fixture(fixture_dir, tmp_path)
  path = target / celeba.ATTR
  lines = path.read_text().split('\n')
  lines[2] = lines[2][:-2] + ' 0'
  path.write_text('\n'.join(lines))
  with pytest.raises(ValueError, match='values other than -1 and 1'):
    celeba.load(smoke_config(str(target)))


def test_corrupt_jpeg_named(fixture_dir, tmp_path):
  target = copy_fixture(fixture_dir, tmp_path)
  path = target / celeba.ZIP
  with zipfile.ZipFile(path) as zf:
    members = {i.filename: zf.read(i) for i in zf.infolist()}
  victim = 'img_align_celeba/000004.jpg'
  members[victim] = members[victim][:200] + b'\x00' * 64  # header kept, data gone
  with zipfile.ZipFile(path, 'w') as zf:
    for name, data in members.items():
      zf.writestr(name, data)
  with pytest.raises(ValueError, match=r'CelebA image 000004\.jpg in img_align_celeba\.zip'):
    celeba.load(smoke_config(str(target)))


def test_tfds_dir_from_other_files_refused(fixture_dir, dataset, tmp_path):
  del dataset  # the fixture's files are prepared into its tfds_dir (not yet, in a fresh worker)
  other = tmp_path / 'other'
  celeba_fixture.generate(str(other), identities=4, max_images=3, seed=9)
  config = smoke_config(
    str(other), tfds_dir=os.path.join(fixture_dir[0], 'tfds'), cache_dir=str(tmp_path / 'cache')
  )
  with pytest.raises(ValueError, match='prepared from other files'):
    celeba.load(config)


def test_bad_config_fields():
  with pytest.raises(ValueError, match='config.data.task'):  # its Declaration's tasks
    validation.resolve(smoke_config('/nonexistent', task='gender'))
  with pytest.raises(ValueError, match='config.data.manual_dir is empty.*mmlab'):
    celeba.load(smoke_config(''))
  with pytest.raises(ValueError, match='config.data.test_fraction'):
    validation.resolve(smoke_config('/nonexistent', test_fraction=1.0))


@pytest.mark.parametrize(
  'file_name,line,value',
  [(celeba.ATTR, 5, 'x1'), (celeba.IDENTITY, 3, '12.5'), (celeba.PARTITION, 7, '0,')],
)
def test_non_integer_value_named_with_file_and_line(fixture_dir, tmp_path, file_name, line, value):
  target = copy_fixture(fixture_dir, tmp_path)
  path = target / file_name
  lines = path.read_text().split('\n')
  parts = lines[line - 1].split(' ')
  lines[line - 1] = ' '.join(parts[:-1] + [value])
  path.write_text('\n'.join(lines))
  with pytest.raises(ValueError) as error:
    celeba.read_metadata(str(target))
  assert f'{file_name} line {line} holds {value!r}, not an integer' in str(error.value)
  assert '\n' not in str(error.value) and 'unmatched data' not in str(error.value)


def _rewrite_zip(path, extra):
  """Rewrite the zip at `path` with its members plus `extra` [(member name, bytes)] at the end."""
  with zipfile.ZipFile(path) as zf:
    members = [(i.filename, zf.read(i)) for i in zf.infolist()]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', UserWarning)  # zipfile warns about a duplicate name
    with zipfile.ZipFile(path, 'w') as zf:
      for name, data in members + extra:
        zf.writestr(name, data)
  return dict(members)


def test_stray_zip_member_does_not_replace_an_image(fixture_dir, dataset, tmp_path):
  target = copy_fixture(fixture_dir, tmp_path)
  with zipfile.ZipFile(target / celeba.ZIP) as zf:
    stray = zf.read('img_align_celeba/000001.jpg')  # a valid JPEG, but not image 000004
  members = _rewrite_zip(
    target / celeba.ZIP,
    [('__MACOSX/img_align_celeba/._000004.jpg', b'resource fork'), ('other/000004.jpg', stray)],
  )
  data = celeba.load(smoke_config(str(target), cache_dir=str(tmp_path / 'cache')))
  meta, (train, test) = meta_and_split(str(target))
  rows = {meta['names'][r]: ('train', i) for i, r in enumerate(train)}
  rows.update({meta['names'][r]: ('test', i) for i, r in enumerate(test)})
  split, index = rows['000004.jpg']
  image = getattr(data, split).images[index]
  assert np.array_equal(image, celeba.decode(members['img_align_celeba/000004.jpg'], 16, '4'))
  assert not np.array_equal(image, celeba.decode(stray, 16, 'stray'))
  assert np.array_equal(data.test.images, dataset.test.images)


def test_duplicate_zip_member_names_both(fixture_dir, tmp_path):
  target = copy_fixture(fixture_dir, tmp_path)
  members = _rewrite_zip(target / celeba.ZIP, [])
  _rewrite_zip(target / celeba.ZIP, [('img_align_celeba/000004.jpg', b'other bytes')])
  with pytest.raises(ValueError) as error:
    celeba.read_metadata(str(target))
  index = list(members).index('img_align_celeba/000004.jpg')
  assert (
    f'img_align_celeba.zip holds img_align_celeba/000004.jpg twice (entries {index} and '
    f'{len(members)}'
  ) in str(error.value)


def test_celeb_a_without_source_record_says_what_to_delete(fixture_dir, tmp_path):
  target = copy_fixture(fixture_dir, tmp_path)
  foreign = celeba_tfds.dataset_dir(str(target / 'tfds'))
  os.makedirs(foreign)
  with open(os.path.join(foreign, 'dataset_info.json'), 'w') as f:
    f.write('{}')
  with pytest.raises(ValueError) as error:
    celeba.load(smoke_config(str(target)))
  assert f'{foreign} holds a celeb_a without' in str(error.value)
  assert 'delete that folder to prepare it again' in str(error.value)
