"""CelebA pipeline on a generated CelebA-format fixture (CPU; TFDS is prepared once per session):
the split, the shards, images, labels and attributes, the official split, the cache and a
prepared TFDS folder (bad files: tests/e2e/test_celeba_bad_files.py; the preparation:
tests/e2e/test_celeba_prepare.py)."""

import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from input_pipeline import batching, celeba, celeba_tfds
from tests.conftest import ROOT
from tests.support.celeba_data import meta_and_split, smoke_config


def test_fixture_has_singletons_and_official_formats(fixture_dir):
  out, owners = fixture_dir
  counts = np.unique(list(owners.values()), return_counts=True)[1]
  assert (counts == 1).any() and (counts > 3).any()
  with open(os.path.join(out, celeba.ATTR)) as f:
    lines = f.read().split('\n')
  assert lines[0] == str(len(owners)) and lines[1].endswith('Young ') and lines[-1] == ''
  assert lines[2][:13] in ('000001.jpg -1', '000001.jpg 1 ')
  with zipfile.ZipFile(os.path.join(out, celeba.ZIP)) as zf:
    assert 'img_align_celeba/000001.jpg' in zf.namelist()


@pytest.mark.parametrize(
  'n,fraction,expected',
  [
    (1, 0.2, 0),
    (2, 0.2, 0),
    (3, 0.2, 1),
    (5, 0.2, 1),
    (8, 0.2, 2),
    (12, 0.2, 2),
    (13, 0.2, 3),
    (2, 0.5, 1),
    (1, 0.9, 0),
    (3, 0.9, 2),
    (30, 0.1, 3),
  ],
)
def test_rounding_rule(n, fraction, expected):
  assert celeba.test_count(n, fraction) == expected


@pytest.mark.parametrize('fraction', [0.2, 0.5])
def test_per_identity_counts_exact_and_disjoint(fixture_dir, fraction):
  out, owners = fixture_dir
  meta, (train, test) = meta_and_split(out, test_fraction=fraction)
  assert not set(train) & set(test) and len(train) + len(test) == len(meta['names'])
  assert not set(meta['names'][train]) & set(meta['names'][test])
  for identity, n in zip(*np.unique(meta['identity'], return_counts=True), strict=True):
    n_test = int((meta['identity'][test] == identity).sum())
    assert n_test == celeba.test_count(int(n), fraction)
    assert (meta['identity'][train] == identity).sum() >= 1  # singletons and all others train
  assert [owners[name] for name in meta['names']] == meta['identity'].tolist()


def test_split_deterministic_and_seeded(fixture_dir):
  out, _ = fixture_dir
  meta, (train_a, test_a) = meta_and_split(out)
  _, (train_b, test_b) = meta_and_split(out)
  _, (_, test_c) = meta_and_split(out, split_seed=7)
  assert np.array_equal(test_a, test_b) and np.array_equal(train_a, train_b)
  assert len(test_c) == len(test_a) and not np.array_equal(test_a, test_c)


def test_split_independent_of_training_seed(fixture_dir, dataset):
  config = smoke_config(fixture_dir[0])
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
      parts = [
        batching.train_batch_indices(n, batch, seed, step, p, processes) for p in range(processes)
      ]
      whole = batching.train_batch_indices(n, batch, seed, step, 0, 1)
      assert np.array_equal(np.sort(np.concatenate(parts)), whole)
      seen.extend(np.concatenate(parts).tolist())
    assert len(seen) == len(set(seen)) == steps * batch  # each example at most once per epoch
    order = batching.epoch_permutation(n, seed, epoch)[: steps * batch]
    assert set(seen) == set(order.tolist())


def test_images_match_their_files(fixture_dir, dataset):
  out, _ = fixture_dir
  meta, (train, test) = meta_and_split(out)
  with zipfile.ZipFile(os.path.join(out, celeba.ZIP)) as zf:
    for split, rows in ((dataset.train, train), (dataset.test, test)):
      for i in (0, len(rows) // 2, len(rows) - 1):
        name = meta['names'][rows[i]]
        jpeg = zf.read(f'img_align_celeba/{name}')
        assert np.array_equal(split.images[i], celeba.decode(jpeg, 16, name))
  assert dataset.train.images.dtype == np.uint8 and dataset.image_shape == (16, 16, 3)


def test_identity_labels(fixture_dir, dataset):
  out, owners = fixture_dir
  meta, (train, test) = meta_and_split(out)
  ids = dataset.info['identity_ids']
  assert dataset.num_classes == len(set(owners.values())) == len(ids) and ids == sorted(ids)
  assert [ids[k] for k in dataset.train.labels] == [owners[n] for n in meta['names'][train]]
  assert [ids[k] for k in dataset.test.labels] == [owners[n] for n in meta['names'][test]]
  assert dataset.task == 'classification' and dataset.train.labels.dtype == np.int32


def test_attributes_parsed_from_minus_one_one(fixture_dir):
  out, _ = fixture_dir
  data = celeba.load(smoke_config(out, task='attributes'))
  with open(os.path.join(out, celeba.ATTR)) as f:
    rows = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in f.readlines()[2:]}
  meta, (train, _) = meta_and_split(out)
  expected = np.asarray([rows[n] for n in meta['names'][train]])
  assert set(np.unique(expected)) == {-1, 1}
  assert np.array_equal(data.train.labels, (expected == 1).astype(np.int32))
  assert data.task == 'multilabel' and data.num_classes == 40


def test_official_split(fixture_dir):
  out, _ = fixture_dir
  data = celeba.load(smoke_config(out, task='attributes', split='official'))
  meta = celeba.read_metadata(out)
  assert len(data.train) == (meta['partition'] == 0).sum()
  assert len(data.test) == (meta['partition'] == 2).sum()
  with pytest.raises(ValueError, match="identity-disjoint.*config.data.split='per_identity'"):
    celeba.load(smoke_config(out, split='official'))


def test_cache_reused_without_decoding_or_tensorflow(fixture_dir, dataset):
  out, _ = fixture_dir
  source_json = os.path.join(celeba_tfds.dataset_dir(os.path.join(out, 'tfds')), celeba_tfds.SOURCE)
  mtime, before = os.path.getmtime(source_json), celeba.DECODED['images']
  again = celeba.load(smoke_config(out))
  assert celeba.DECODED['images'] == before and os.path.getmtime(source_json) == mtime
  assert np.array_equal(again.train.images, dataset.train.images)
  assert isinstance(again.train.images, np.memmap)
  code = (
    'import sys; from configs import celeba as c; from input_pipeline import celeba as p; '
    f'cfg = c.get_config("smoke"); cfg.data.manual_dir = {out!r}; d = p.load(cfg); '
    f'cfg.data.manual_dir = ""; cfg.data.tfds_dir = {os.path.join(out, "tfds")!r}; '
    'e = p.load(cfg); assert e.info["decoded_cache"] == d.info["decoded_cache"]; '
    'assert p.DECODED["images"] == 0 and "tensorflow" not in sys.modules; print(len(d.train))'
  )
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  result = subprocess.run(
    [sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == str(len(dataset.train))


def test_reuses_prepared_tfds_without_manual_dir(fixture_dir, dataset, tmp_path):
  out, _ = fixture_dir
  config = smoke_config('', tfds_dir=os.path.join(out, 'tfds'), cache_dir=str(tmp_path / 'cache'))
  data = celeba.load(config)  # decodes into a fresh cache from the prepared TFDS alone
  assert data.info['split_fingerprint'] == dataset.info['split_fingerprint']
  assert np.array_equal(data.test.images, dataset.test.images)
