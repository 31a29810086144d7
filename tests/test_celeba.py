"""CelebA pipeline on a generated CelebA-format fixture (CPU; TFDS is prepared once per session)."""

import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest

from configs import celeba as celeba_config
from input_pipeline import batching, celeba, celeba_files, celeba_fixture

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def fixture_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('celeba') / 'files')
  owners = celeba_fixture.generate(out, identities=16, max_images=9, seed=3)
  return out, owners


def _config(manual_dir, **data):
  config = celeba_config.get_config('smoke')
  config.data.manual_dir = manual_dir
  for key, value in data.items():
    config.data[key] = value
  return config


@pytest.fixture(scope='session')
def dataset(fixture_dir):
  return celeba.load(_config(fixture_dir[0]))


def _meta_and_split(manual_dir, **data):
  config = _config(manual_dir, **data)
  meta = celeba_files.read_metadata(manual_dir)
  return meta, celeba._split(config.data, meta)


def test_fixture_has_singletons_and_official_formats(fixture_dir):
  out, owners = fixture_dir
  counts = np.unique(list(owners.values()), return_counts=True)[1]
  assert (counts == 1).any() and (counts > 3).any()
  with open(os.path.join(out, celeba_files.ATTR)) as f:
    lines = f.read().split('\n')
  assert lines[0] == str(len(owners)) and lines[1].endswith('Young ') and lines[-1] == ''
  assert lines[2][:13] in ('000001.jpg -1', '000001.jpg 1 ')
  with zipfile.ZipFile(os.path.join(out, celeba_files.ZIP)) as zf:
    assert 'img_align_celeba/000001.jpg' in zf.namelist()


@pytest.mark.parametrize('n,fraction,expected', [
    (1, 0.2, 0), (2, 0.2, 0), (3, 0.2, 1), (5, 0.2, 1), (8, 0.2, 2), (12, 0.2, 2), (13, 0.2, 3),
    (2, 0.5, 1), (1, 0.9, 0), (3, 0.9, 2), (30, 0.1, 3)])
def test_rounding_rule(n, fraction, expected):
  assert celeba_files.test_count(n, fraction) == expected


@pytest.mark.parametrize('fraction', [0.2, 0.5])
def test_per_identity_counts_exact_and_disjoint(fixture_dir, fraction):
  out, owners = fixture_dir
  meta, (train, test) = _meta_and_split(out, test_fraction=fraction)
  assert not set(train) & set(test) and len(train) + len(test) == len(meta['names'])
  assert not set(meta['names'][train]) & set(meta['names'][test])
  for identity, n in zip(*np.unique(meta['identity'], return_counts=True)):
    n_test = int((meta['identity'][test] == identity).sum())
    assert n_test == celeba_files.test_count(int(n), fraction)
    assert (meta['identity'][train] == identity).sum() >= 1  # singletons and all others train
  assert [owners[name] for name in meta['names']] == meta['identity'].tolist()


def test_split_deterministic_and_seeded(fixture_dir):
  out, _ = fixture_dir
  meta, (train_a, test_a) = _meta_and_split(out)
  _, (train_b, test_b) = _meta_and_split(out)
  _, (_, test_c) = _meta_and_split(out, split_seed=7)
  assert np.array_equal(test_a, test_b) and np.array_equal(train_a, train_b)
  assert len(test_c) == len(test_a) and not np.array_equal(test_a, test_c)


def test_split_independent_of_training_seed(fixture_dir, dataset):
  config = _config(fixture_dir[0])
  config.seed = 1234
  other = celeba.load(config)
  assert other.info['split_fingerprint'] == dataset.info['split_fingerprint']
  assert np.array_equal(other.train.labels, dataset.train.labels)
  assert np.array_equal(other.test.images, dataset.test.images)


@pytest.mark.parametrize('processes', [1, 2, 4])
def test_process_shards_disjoint_and_complete(dataset, processes):
  n, batch, seed = len(dataset.train), 8, 0
  steps = batching.steps_per_epoch(n, batch)
  for epoch in range(2):
    seen = []
    for step in range(epoch * steps, (epoch + 1) * steps):
      parts = [batching.train_batch_indices(n, batch, seed, step, p, processes)
               for p in range(processes)]
      whole = batching.train_batch_indices(n, batch, seed, step, 0, 1)
      assert np.array_equal(np.sort(np.concatenate(parts)), whole)
      seen.extend(np.concatenate(parts).tolist())
    assert len(seen) == len(set(seen)) == steps * batch  # each example at most once per epoch
    order = batching.epoch_permutation(n, seed, epoch)[:steps * batch]
    assert set(seen) == set(order.tolist())


def test_images_match_their_files(fixture_dir, dataset):
  out, _ = fixture_dir
  meta, (train, test) = _meta_and_split(out)
  with zipfile.ZipFile(os.path.join(out, celeba_files.ZIP)) as zf:
    for split, rows in ((dataset.train, train), (dataset.test, test)):
      for i in (0, len(rows) // 2, len(rows) - 1):
        name = meta['names'][rows[i]]
        jpeg = zf.read(f'img_align_celeba/{name}')
        assert np.array_equal(split.images[i], celeba.decode(jpeg, 16, name))
  assert dataset.train.images.dtype == np.uint8 and dataset.image_shape == (16, 16, 3)


def test_identity_labels(fixture_dir, dataset):
  out, owners = fixture_dir
  meta, (train, test) = _meta_and_split(out)
  ids = dataset.info['identity_ids']
  assert dataset.num_classes == len(set(owners.values())) == len(ids) and ids == sorted(ids)
  assert [ids[k] for k in dataset.train.labels] == [owners[n] for n in meta['names'][train]]
  assert [ids[k] for k in dataset.test.labels] == [owners[n] for n in meta['names'][test]]
  assert dataset.task == 'classification' and dataset.train.labels.dtype == np.int32


def test_attributes_parsed_from_minus_one_one(fixture_dir):
  out, _ = fixture_dir
  data = celeba.load(_config(out, task='attributes'))
  with open(os.path.join(out, celeba_files.ATTR)) as f:
    rows = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in f.readlines()[2:]}
  meta, (train, _) = _meta_and_split(out)
  expected = np.asarray([rows[n] for n in meta['names'][train]])
  assert set(np.unique(expected)) == {-1, 1}
  assert np.array_equal(data.train.labels, (expected == 1).astype(np.int32))
  assert data.task == 'multilabel' and data.num_classes == 40


def test_official_split(fixture_dir):
  out, _ = fixture_dir
  data = celeba.load(_config(out, task='attributes', split='official'))
  meta = celeba_files.read_metadata(out)
  assert len(data.train) == (meta['partition'] == 0).sum()
  assert len(data.test) == (meta['partition'] == 2).sum()
  with pytest.raises(ValueError, match="identity-disjoint.*config.data.split='per_identity'"):
    celeba.load(_config(out, split='official'))


def test_cache_reused_without_decoding_or_tensorflow(fixture_dir, dataset):
  out, _ = fixture_dir
  source_json = os.path.join(out, 'tfds', 'celeb_a_source.json')
  mtime, before = os.path.getmtime(source_json), celeba.DECODED['images']
  again = celeba.load(_config(out))
  assert celeba.DECODED['images'] == before and os.path.getmtime(source_json) == mtime
  assert np.array_equal(again.train.images, dataset.train.images)
  assert isinstance(again.train.images, np.memmap)
  code = ('import sys; from configs import celeba as c; from input_pipeline import celeba as p; '
          f'cfg = c.get_config("smoke"); cfg.data.manual_dir = {out!r}; d = p.load(cfg); '
          f'cfg.data.manual_dir = ""; cfg.data.tfds_dir = {os.path.join(out, "tfds")!r}; '
          'e = p.load(cfg); assert e.info["decoded_cache"] == d.info["decoded_cache"]; '
          'assert p.DECODED["images"] == 0 and "tensorflow" not in sys.modules; print(len(d.train))')
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == str(len(dataset.train))


def test_reuses_prepared_tfds_without_manual_dir(fixture_dir, dataset, tmp_path):
  out, _ = fixture_dir
  config = _config('', tfds_dir=os.path.join(out, 'tfds'), cache_dir=str(tmp_path / 'cache'))
  data = celeba.load(config)  # decodes into a fresh cache from the prepared TFDS alone
  assert data.info['split_fingerprint'] == dataset.info['split_fingerprint']
  assert np.array_equal(data.test.images, dataset.test.images)


def test_missing_files_listed(tmp_path, fixture_dir):
  with pytest.raises(FileNotFoundError) as error:
    celeba.load(_config(str(tmp_path)))
  message = str(error.value)
  assert all(f in message for f in celeba_files.FILES) and celeba_files.CELEBA_PAGE in message
  partial = tmp_path / 'partial'
  shutil.copytree(fixture_dir[0], partial, ignore=shutil.ignore_patterns('tfds'))
  os.remove(partial / celeba_files.IDENTITY)
  os.remove(partial / celeba_files.ZIP)
  with pytest.raises(FileNotFoundError, match='lacks img_align_celeba.zip, identity_CelebA.txt:'):
    celeba.load(_config(str(partial)))


def _copy(fixture_dir, tmp_path):
  target = tmp_path / 'copy'
  shutil.copytree(fixture_dir[0], target, ignore=shutil.ignore_patterns('tfds'))
  return target


def test_truncated_zip_is_an_error(fixture_dir, tmp_path):
  target = _copy(fixture_dir, tmp_path)
  path = target / celeba_files.ZIP
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  with pytest.raises(ValueError, match='img_align_celeba.zip is not a readable zip.*truncated'):
    celeba.load(_config(str(target)))


@pytest.mark.parametrize('file_name,pattern', [
    (celeba_files.ATTR, 'list_attr_celeba.txt declares'),
    (celeba_files.LANDMARKS, 'list_landmarks_align_celeba.txt declares'),
    (celeba_files.IDENTITY, 'identity_CelebA.txt lists other images')])
def test_truncated_text_file_is_an_error(fixture_dir, tmp_path, file_name, pattern):
  target = _copy(fixture_dir, tmp_path)
  path = target / file_name
  path.write_text(''.join(path.read_text().splitlines(keepends=True)[:-3]))
  with pytest.raises(ValueError, match=pattern):
    celeba.load(_config(str(target)))


def test_bad_attribute_value_is_an_error(fixture_dir, tmp_path):
  target = _copy(fixture_dir, tmp_path)
  path = target / celeba_files.ATTR
  lines = path.read_text().split('\n')
  lines[2] = lines[2][:-2] + ' 0'
  path.write_text('\n'.join(lines))
  with pytest.raises(ValueError, match='values other than -1 and 1'):
    celeba.load(_config(str(target)))


def test_corrupt_jpeg_named(fixture_dir, tmp_path):
  target = _copy(fixture_dir, tmp_path)
  path = target / celeba_files.ZIP
  with zipfile.ZipFile(path) as zf:
    members = {i.filename: zf.read(i) for i in zf.infolist()}
  victim = 'img_align_celeba/000004.jpg'
  members[victim] = members[victim][:200] + b'\x00' * 64  # header kept, data gone
  with zipfile.ZipFile(path, 'w') as zf:
    for name, data in members.items():
      zf.writestr(name, data)
  with pytest.raises(ValueError, match=r'CelebA image 000004\.jpg in img_align_celeba\.zip'):
    celeba.load(_config(str(target)))


def test_tfds_dir_from_other_files_refused(fixture_dir, dataset, tmp_path):
  del dataset  # the fixture's files are prepared into its tfds_dir (not yet, in a fresh worker)
  other = tmp_path / 'other'
  celeba_fixture.generate(str(other), identities=4, max_images=3, seed=9)
  config = _config(str(other), tfds_dir=os.path.join(fixture_dir[0], 'tfds'),
                   cache_dir=str(tmp_path / 'cache'))
  with pytest.raises(ValueError, match='prepared from other files'):
    celeba.load(config)


def test_bad_config_fields():
  with pytest.raises(ValueError, match='config.data.task'):
    celeba.load(_config('/nonexistent', task='gender'))
  with pytest.raises(ValueError, match='config.data.manual_dir is empty.*mmlab'):
    celeba.load(_config(''))
  with pytest.raises(ValueError, match='config.data.test_fraction'):
    celeba.load(_config('/nonexistent', test_fraction=1.0))


FIRST_LOAD = """
import sys
sys.path.insert(0, {repo!r})
from absl import logging
from configs import celeba as celeba_config
from input_pipeline import celeba
logging.set_verbosity(logging.INFO)
config = celeba_config.get_config('smoke')
config.data.manual_dir = {manual_dir!r}
dataset = celeba.load(config)
print(celeba.DECODED['images'], len(dataset.train) + len(dataset.test))
"""


@pytest.mark.timeout(600)
def test_concurrent_first_loads_prepare_and_decode_once(fixture_dir, tmp_path, subprocess_env):
  """Two runs started together on fresh files: one prepares and decodes, the other waits, reuses."""
  target = str(_copy(fixture_dir, tmp_path))
  cache_dir = celeba._dirs(_config(target).data)[2]
  script = FIRST_LOAD.format(repo=REPO, manual_dir=target)
  procs, errs = [], []
  with celeba.preparation_lock(cache_dir):  # held until both processes queue behind it
    for _ in range(2):
      procs.append(subprocess.Popen([sys.executable, '-c', script], env=subprocess_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
      errs.append([])
      threading.Thread(target=lambda p=procs[-1], e=errs[-1]: e.extend(p.stderr),
                       daemon=True).start()
    deadline = time.time() + 300
    while time.time() < deadline and not all(
        any('is preparing CelebA' in line for line in e) for e in errs):
      assert all(p.poll() is None for p in procs), ''.join(sum(errs, []))[-3000:]
      time.sleep(0.2)
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], ''.join(sum(errs, []))[-3000:]
  decoded, totals = zip(*(map(int, out.split()[-2:]) for out in outs))
  assert sorted(decoded) == [0, totals[0]] and totals[0] == totals[1]  # decoded exactly once
