"""CelebA pipeline on a generated CelebA-format fixture (CPU; TFDS is prepared once per session)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import warnings
import zipfile

import numpy as np
import pytest
from tensorflow_datasets.core import shuffle

from benchmarks import bench_celeba_full
from configs import celeba as celeba_config
from configs import validation
from input_pipeline import batching, celeba, celeba_files, celeba_fixture, celeba_tfds
from tests.conftest import ROOT
from trainer import run

REPO = ROOT


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
  assert celeba_files.test_count(n, fraction) == expected


@pytest.mark.parametrize('fraction', [0.2, 0.5])
def test_per_identity_counts_exact_and_disjoint(fixture_dir, fraction):
  out, owners = fixture_dir
  meta, (train, test) = _meta_and_split(out, test_fraction=fraction)
  assert not set(train) & set(test) and len(train) + len(test) == len(meta['names'])
  assert not set(meta['names'][train]) & set(meta['names'][test])
  for identity, n in zip(*np.unique(meta['identity'], return_counts=True), strict=True):
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
  source_json = os.path.join(celeba_tfds.dataset_dir(os.path.join(out, 'tfds')), celeba_tfds.SOURCE)
  mtime, before = os.path.getmtime(source_json), celeba.DECODED['images']
  again = celeba.load(_config(out))
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
    [sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True, text=True, check=False
  )
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


def test_core_install_without_tfds_is_one_line_and_leaves_no_lock(
  fixture_dir, dataset, tmp_path, monkeypatch
):
  """Before: a 35-line ModuleNotFoundError traceback from train.py, and <cache_dir>/.prepare.lock
  left behind. Now the sweep check's line, as a ConfigError (train.py: exit 2), nothing made."""
  del dataset  # the fixture's files prepared into its tfds_dir (for the second case)
  target = _copy(fixture_dir, tmp_path)
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # import fails: the core install
  with pytest.raises(validation.ConfigError) as error:
    run.load_dataset(_config(str(target)))
  assert str(error.value) == (
    f'config.data.manual_dir={str(target)!r}: preparing CelebA needs '
    'tensorflow-datasets, which is not installed: pip install -r '
    'requirements-celeba.txt'
  )
  assert sorted(os.listdir(target)) == sorted(celeba_files.FILES)  # no tfds/, no lock, no cache
  # A prepared tfds_dir whose decoded cache is not built yet needs TFDS to decode, too.
  config = _config(
    '', tfds_dir=os.path.join(fixture_dir[0], 'tfds'), cache_dir=str(tmp_path / 'cache')
  )
  with pytest.raises(validation.ConfigError, match=r"^config.data.tfds_dir='.*': preparing"):
    run.load_dataset(config)
  assert not (tmp_path / 'cache').exists()


def test_truncated_zip_is_an_error(fixture_dir, tmp_path):
  target = _copy(fixture_dir, tmp_path)
  path = target / celeba_files.ZIP
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(ValueError, match='img_align_celeba.zip is not a readable zip.*truncated'):
    celeba.load(_config(str(target)))


@pytest.mark.parametrize(
  'file_name,pattern',
  [
    (celeba_files.ATTR, 'list_attr_celeba.txt declares'),
    (celeba_files.LANDMARKS, 'list_landmarks_align_celeba.txt declares'),
    (celeba_files.IDENTITY, 'identity_CelebA.txt lists other images'),
  ],
)
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
  config = _config(
    str(other), tfds_dir=os.path.join(fixture_dir[0], 'tfds'), cache_dir=str(tmp_path / 'cache')
  )
  with pytest.raises(ValueError, match='prepared from other files'):
    celeba.load(config)


def test_bad_config_fields():
  with pytest.raises(ValueError, match='config.data.task'):  # its Declaration's tasks
    validation.resolve(_config('/nonexistent', task='gender'))
  with pytest.raises(ValueError, match='config.data.manual_dir is empty.*mmlab'):
    celeba.load(_config(''))
  with pytest.raises(ValueError, match='config.data.test_fraction'):
    validation.resolve(_config('/nonexistent', test_fraction=1.0))


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
  cache_dir = celeba.data_dirs(_config(target).data)[2]
  script = FIRST_LOAD.format(repo=REPO, manual_dir=target)
  procs, errs, readers = [], [], []
  with celeba.preparation_lock(cache_dir):  # held until both processes queue behind it
    for _ in range(2):
      procs.append(
        subprocess.Popen(
          [sys.executable, '-c', script],
          env=subprocess_env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
        )
      )
      errs.append([])
      readers.append(
        threading.Thread(target=lambda p=procs[-1], e=errs[-1]: e.extend(p.stderr), daemon=True)
      )
      readers[-1].start()
    deadline = time.time() + 300
    while time.time() < deadline and not all(
      any('is preparing CelebA' in line for line in e) for e in errs
    ):
      assert all(p.poll() is None for p in procs), ''.join(sum(errs, []))[-3000:]
      time.sleep(0.2)
  # stdout read to its end (the process's exit), stderr left to the readers: communicate() would
  # read stderr too, racing the readers for its last lines
  outs = [p.stdout.read() for p in procs]
  for p in procs:
    p.wait(timeout=300)
  for reader in readers:
    reader.join(timeout=60)
  assert [p.returncode for p in procs] == [0, 0], ''.join(sum(errs, []))[-3000:]
  decoded, totals = zip(*(map(int, out.split()[-2:]) for out in outs), strict=True)
  assert sorted(decoded) == [0, totals[0]] and totals[0] == totals[1]  # decoded exactly once
  # The preparation says it is offline (TFDS's own line said "Downloading and preparing").
  assert not any('Downloading' in out for out in outs)
  assert sum('Preparing TFDS celeb_a 2.1.0 offline' in ''.join(e) for e in errs) == 1


@pytest.mark.parametrize(
  'file_name,line,value',
  [
    (celeba_files.ATTR, 5, 'x1'),
    (celeba_files.IDENTITY, 3, '12.5'),
    (celeba_files.PARTITION, 7, '0,'),
  ],
)
def test_non_integer_value_named_with_file_and_line(fixture_dir, tmp_path, file_name, line, value):
  target = _copy(fixture_dir, tmp_path)
  path = target / file_name
  lines = path.read_text().split('\n')
  parts = lines[line - 1].split(' ')
  lines[line - 1] = ' '.join(parts[:-1] + [value])
  path.write_text('\n'.join(lines))
  with pytest.raises(ValueError) as error:
    celeba_files.read_metadata(str(target))
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
  target = _copy(fixture_dir, tmp_path)
  with zipfile.ZipFile(target / celeba_files.ZIP) as zf:
    stray = zf.read('img_align_celeba/000001.jpg')  # a valid JPEG, but not image 000004
  members = _rewrite_zip(
    target / celeba_files.ZIP,
    [('__MACOSX/img_align_celeba/._000004.jpg', b'resource fork'), ('other/000004.jpg', stray)],
  )
  data = celeba.load(_config(str(target), cache_dir=str(tmp_path / 'cache')))
  meta, (train, test) = _meta_and_split(str(target))
  rows = {meta['names'][r]: ('train', i) for i, r in enumerate(train)}
  rows.update({meta['names'][r]: ('test', i) for i, r in enumerate(test)})
  split, index = rows['000004.jpg']
  image = getattr(data, split).images[index]
  assert np.array_equal(image, celeba.decode(members['img_align_celeba/000004.jpg'], 16, '4'))
  assert not np.array_equal(image, celeba.decode(stray, 16, 'stray'))
  assert np.array_equal(data.test.images, dataset.test.images)


def test_duplicate_zip_member_names_both(fixture_dir, tmp_path):
  target = _copy(fixture_dir, tmp_path)
  members = _rewrite_zip(target / celeba_files.ZIP, [])
  _rewrite_zip(target / celeba_files.ZIP, [('img_align_celeba/000004.jpg', b'other bytes')])
  with pytest.raises(ValueError) as error:
    celeba_files.read_metadata(str(target))
  index = list(members).index('img_align_celeba/000004.jpg')
  assert (
    f'img_align_celeba.zip holds img_align_celeba/000004.jpg twice (entries {index} and '
    f'{len(members)}'
  ) in str(error.value)


def test_celeb_a_without_source_record_says_what_to_delete(fixture_dir, tmp_path):
  target = _copy(fixture_dir, tmp_path)
  foreign = celeba_tfds.dataset_dir(str(target / 'tfds'))
  os.makedirs(foreign)
  with open(os.path.join(foreign, 'dataset_info.json'), 'w') as f:
    f.write('{}')
  with pytest.raises(ValueError) as error:
    celeba.load(_config(str(target)))
  assert f'{foreign} holds a celeb_a without' in str(error.value)
  assert 'delete that folder to prepare it again' in str(error.value)


def test_leftovers_of_dead_processes_removed_others_named(tmp_path, caplog):
  dead = subprocess.run(
    [sys.executable, '-c', 'import os; print(os.getpid())'],
    check=True,
    capture_output=True,
    text=True,
  )
  dead_pid, host = int(dead.stdout), socket.gethostname()
  names = {
    f'celeb_a.partial-{host}-{dead_pid}': False,
    f'abc-64px.partial-{dead_pid}': False,
    f'abc-32px.partial-{host}-{os.getppid()}': True,  # a live process: kept
    'celeb_a.partial-some-other-host-1': True,
    'celeb_a/incomplete.ABC123_2.1.0': True,
  }
  for name in names:
    os.makedirs(tmp_path / name / 'x')
  with caplog.at_level('INFO'):
    celeba_tfds.remove_leftovers(str(tmp_path))
  assert {name: (tmp_path / name).exists() for name in names} == names
  warned = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert len(warned) == 2 and any('some-other-host' in w for w in warned)
  assert any('incomplete.ABC123' in w for w in warned)


KILLED_LOAD = """
import os, signal, sys, zipfile
sys.path.insert(0, {repo!r})
import numpy as np
from configs import celeba as celeba_config
from input_pipeline import celeba
calls = [0]
def dying(original, after):
  def wrapper(*args, **kwargs):
    calls[0] += 1
    if calls[0] > after:
      os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)
  return wrapper
{patch}
config = celeba_config.get_config('smoke')
config.data.manual_dir = {manual_dir!r}
celeba.load(config)
"""
KILL_POINTS = {  # where a preparation is killed: (the patch, what it leaves behind)
  'mid_tfds': ('zipfile.ZipExtFile.read = dying(zipfile.ZipExtFile.read, 10)', 'incomplete.'),
  'after_tfds_before_record': ('np.savez = dying(np.savez, 0)', 'celeb_a'),  # TFDS's output
  'mid_decode': ('celeba.decode = dying(celeba.decode, 5)', 'px-'),
}


def _entries(folder):
  return [os.path.join(d, n) for d, dirs, files in os.walk(folder) for n in dirs + files]


@pytest.mark.timeout(600)
@pytest.mark.parametrize('point', sorted(KILL_POINTS))
def test_killed_preparation_leaves_nothing_that_blocks(
  fixture_dir, dataset, tmp_path, subprocess_env, point
):
  """SIGKILL at a point of the first load; the next load prepares, and deletes the leftovers."""
  target = str(_copy(fixture_dir, tmp_path))
  patch, left = KILL_POINTS[point]
  script = KILLED_LOAD.format(repo=REPO, patch=patch, manual_dir=target)
  result = subprocess.run(
    [sys.executable, '-c', script], env=subprocess_env, capture_output=True, text=True, check=False
  )
  assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
  assert any(left in e for e in _entries(target)), _entries(target)  # the kill left its files
  data = celeba.load(_config(target))
  assert np.array_equal(data.test.images, dataset.test.images)
  assert [e for e in _entries(target) if '.partial-' in e or 'incomplete.' in e] == []


WRITE_CACHE = """
import resource, sys, zipfile
sys.path.insert(0, {repo!r})
import numpy as np
from input_pipeline import celeba, celeba_files
meta = celeba_files.read_metadata({manual_dir!r})
zf = zipfile.ZipFile({zip_path!r})
def records(partition):  # (JPEG, identity) in record order, as celeba_tfds.iter_records gives
  for name, identity, part in zip(meta['names'], meta['identity'], meta['partition']):
    if part == partition:
      yield zf.read(f'img_align_celeba/{{name}}'), identity
celeba.write_cache({out!r}, {{'train': np.arange({count})}}, meta, {size}, records, 'the fixture')
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # peak RSS, KiB
"""
RSS_GROWTH_LIMIT_MIB = 8  # what 3N more images may add to peak RSS (they are 3 x 29 MiB decoded)


def test_decoding_peak_rss_does_not_grow_with_the_images(tmp_path, subprocess_env):
  """Peak RSS of a fresh process decoding N = 213 vs 4N images (218 px: 139 KiB each) differs by
  less than RSS_GROWTH_LIMIT_MIB: the cache is written, not mapped (mapped pages count in RSS)."""
  manual_dir = str(tmp_path / 'files')
  celeba_fixture.generate(manual_dir, identities=20, seed=5, images=852)
  peaks = []
  for count in (213, 852):
    out = tmp_path / f'cache{count}'
    out.mkdir()
    script = WRITE_CACHE.format(
      repo=REPO,
      manual_dir=manual_dir,
      out=str(out),
      count=count,
      size=218,
      zip_path=os.path.join(manual_dir, celeba_files.ZIP),
    )
    result = subprocess.run(
      [sys.executable, '-c', script],
      env=subprocess_env,
      capture_output=True,
      text=True,
      check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    peaks.append(int(result.stdout.split()[-1]) / 1024)
  written = np.load(tmp_path / 'cache852' / 'train.npy', mmap_mode='r')
  meta = celeba_files.read_metadata(manual_dir)
  with zipfile.ZipFile(os.path.join(manual_dir, celeba_files.ZIP)) as zf:
    for row in (0, 500, 851):
      name = meta['names'][row]
      assert np.array_equal(
        written[row], celeba.decode(zf.read(f'img_align_celeba/{name}'), 218, name)
      )
  assert written.nbytes / 2**20 > 100 and peaks[1] - peaks[0] < RSS_GROWTH_LIMIT_MIB, peaks


def test_bench_celeba_full_runs_at_a_tiny_size(tmp_path, capsys):
  workdir = tmp_path / 'bench'
  bench_celeba_full.main(
    [
      '--workdir',
      str(workdir),
      '--images',
      '40',
      '--identities',
      '8',
      '--image-size',
      '8',
      '--gather-steps',
      '2',
      '--batch',
      '4',
    ]
  )
  text = capsys.readouterr().out
  assert (
    '40 images (' in text
    and '| · prepare (TFDS) |' in text
    and '| · decode + write cache |' in text
  )
  assert 'decoded cache 0 MiB (N x 8^2 x 3 = 0 MiB)' in text and not workdir.exists()


def test_tfds_dir_of_an_earlier_layout_still_reads(fixture_dir, dataset, tmp_path):
  """Before atomic preparation the source record and index sat beside celeb_a/, not inside."""
  tfds_dir = tmp_path / 'tfds'
  shutil.copytree(
    os.path.join(fixture_dir[0], 'tfds'), tfds_dir, ignore=shutil.ignore_patterns('decoded_cache')
  )
  for name in (celeba_tfds.SOURCE, celeba_tfds.INDEX):
    os.rename(os.path.join(celeba_tfds.dataset_dir(str(tfds_dir)), name), tfds_dir / name)
  data = celeba.load(_config('', tfds_dir=str(tfds_dir), cache_dir=str(tmp_path / 'cache')))
  assert np.array_equal(data.test.images, dataset.test.images)


def test_record_keys_keep_order_and_spread_over_tfds_buckets():
  keys = [celeba_tfds.record_key(i) for i in range(202599)]  # the full CelebA in one split
  buckets = np.asarray([shuffle.get_bucket_number(k, shuffle.BUCKETS_NUMBER) for k in keys])
  assert keys == sorted(keys) and len(set(keys)) == len(keys) and np.all(np.diff(buckets) >= 0)
  assert np.bincount(buckets).max() <= 1049  # TFDS reads one bucket back into memory at a time
  with pytest.raises(ValueError, match='more than 1048576 records'):
    celeba_tfds.record_key(2**20)


def test_prepared_through_tfds_buckets_in_record_order(fixture_dir, dataset, tmp_path, monkeypatch):
  """With TFDS's in-memory buffer at 0 bytes every record goes through its buckets: same data."""

  monkeypatch.setattr(shuffle, 'MAX_MEM_BUFFER_SIZE', 0)
  target = str(_copy(fixture_dir, tmp_path))
  data = celeba.load(_config(target))
  assert np.array_equal(data.test.images, dataset.test.images)
  assert np.array_equal(data.train.images, dataset.train.images)


def test_too_little_disk_for_the_cache_refused_before_any_work(fixture_dir, tmp_path, monkeypatch):
  target = str(_copy(fixture_dir, tmp_path))
  monkeypatch.setattr(celeba.shutil, 'disk_usage', lambda _: types.SimpleNamespace(free=1000))
  with pytest.raises(
    ValueError,
    match=r'config.data.cache_dir=.*needs [0-9.]+ MiB and that disk has '
    r'0.0 MiB free: free space there or set config.data.cache_dir',
  ):
    celeba.load(_config(target))
  assert not os.path.exists(os.path.join(target, 'tfds', 'celeb_a'))  # refused before TFDS
