"""CelebA pipeline on a generated CelebA-format fixture (CPU), the preparation: concurrent first
loads, killed preparations and their leftovers, peak memory while decoding, TFDS's buckets and
an earlier TFDS layout, the disk check, and bench_input --images at a tiny size."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import zipfile

import numpy as np
import pytest
from tensorflow_datasets.core import shuffle

from benchmarks import bench_input
from input_pipeline import celeba, celeba_fixture, celeba_tfds
from tests.conftest import ROOT
from tests.support.celeba_data import copy_fixture, smoke_config

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
  target = str(copy_fixture(fixture_dir, tmp_path))
  cache_dir = celeba.data_dirs(smoke_config(target).data)[2]
  script = FIRST_LOAD.format(repo=ROOT, manual_dir=target)
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
  target = str(copy_fixture(fixture_dir, tmp_path))
  patch, left = KILL_POINTS[point]
  script = KILLED_LOAD.format(repo=ROOT, patch=patch, manual_dir=target)
  result = subprocess.run(
    [sys.executable, '-c', script], env=subprocess_env, capture_output=True, text=True, check=False
  )
  assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
  assert any(left in e for e in _entries(target)), _entries(target)  # the kill left its files
  data = celeba.load(smoke_config(target))
  assert np.array_equal(data.test.images, dataset.test.images)
  assert [e for e in _entries(target) if '.partial-' in e or 'incomplete.' in e] == []


WRITE_CACHE = """
import resource, sys, zipfile
sys.path.insert(0, {repo!r})
import numpy as np
from input_pipeline import celeba
meta = celeba.read_metadata({manual_dir!r})
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
      repo=ROOT,
      manual_dir=manual_dir,
      out=str(out),
      count=count,
      size=218,
      zip_path=os.path.join(manual_dir, celeba.ZIP),
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
  meta = celeba.read_metadata(manual_dir)
  with zipfile.ZipFile(os.path.join(manual_dir, celeba.ZIP)) as zf:
    for row in (0, 500, 851):
      name = meta['names'][row]
      assert np.array_equal(
        written[row], celeba.decode(zf.read(f'img_align_celeba/{name}'), 218, name)
      )
  assert written.nbytes / 2**20 > 100 and peaks[1] - peaks[0] < RSS_GROWTH_LIMIT_MIB, peaks


def test_bench_input_runs_at_a_tiny_size(tmp_path, capsys):
  workdir = tmp_path / 'bench'
  bench_input.main(
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
  data = celeba.load(smoke_config('', tfds_dir=str(tfds_dir), cache_dir=str(tmp_path / 'cache')))
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
  target = str(copy_fixture(fixture_dir, tmp_path))
  data = celeba.load(smoke_config(target))
  assert np.array_equal(data.test.images, dataset.test.images)
  assert np.array_equal(data.train.images, dataset.train.images)


def test_too_little_disk_for_the_cache_refused_before_any_work(fixture_dir, tmp_path, monkeypatch):
  target = str(copy_fixture(fixture_dir, tmp_path))
  monkeypatch.setattr(celeba.shutil, 'disk_usage', lambda _: types.SimpleNamespace(free=1000))
  with pytest.raises(
    ValueError,
    match=r'config.data.cache_dir=.*needs [0-9.]+ MiB and that disk has '
    r'0.0 MiB free: free space there or set config.data.cache_dir',
  ):
    celeba.load(smoke_config(target))
  assert not os.path.exists(os.path.join(target, 'tfds', 'celeb_a'))  # refused before TFDS
