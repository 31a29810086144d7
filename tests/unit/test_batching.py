"""Deterministic per-process batching: every example once per epoch, eval without drops."""

import numpy as np
import pytest

import input_pipeline
from configs import digits, validation
from input_pipeline import batching
from trainer import process, run


def _split(n):
  images = np.arange(n, dtype=np.uint8).reshape(n, 1, 1, 1)
  return input_pipeline.Split(images, np.arange(n, dtype=np.int32))


def test_train_batches_cover_each_example_at_most_once_per_epoch_for_any_process_count():
  n, batch = 103, 8
  per_epoch = batching.steps_per_epoch(n, batch)
  for processes in (1, 2, 4):
    seen = np.concatenate(
      [
        batching.train_batch_indices(
          n, batch, seed=3, step=s, process_index=p, process_count=processes
        )
        for s in range(per_epoch, 2 * per_epoch)
        for p in range(processes)
      ]
    )
    assert len(seen) == per_epoch * batch and len(set(seen.tolist())) == len(seen)
    if processes == 1:
      reference = seen
    np.testing.assert_array_equal(np.sort(seen), np.sort(reference))


def test_order_depends_on_seed_and_epoch_only():
  a = batching.train_batch_indices(50, 10, seed=1, step=0)
  np.testing.assert_array_equal(a, batching.train_batch_indices(50, 10, seed=1, step=0))
  assert not np.array_equal(a, batching.train_batch_indices(50, 10, seed=2, step=0))
  assert not np.array_equal(a, batching.train_batch_indices(50, 10, seed=1, step=5))


def test_eval_batches_count_every_example_exactly_once():
  split = _split(37)
  for processes in (1, 2, 4):
    labels, weights = [], []
    for p in range(processes):
      for b in batching.eval_batches(split, 16, p, processes):
        assert len(b['label']) == 16 // processes
        labels.append(b['label']), weights.append(b['mask'])
    labels, weights = np.concatenate(labels), np.concatenate(weights)
    assert weights.sum() == 37
    np.testing.assert_array_equal(np.sort(labels[weights > 0]), np.arange(37))
  assert batching.num_eval_batches(37, 16) == 3


def test_prefetch_preserves_order_and_ends():
  assert list(batching.prefetch(iter(range(10)), 3)) == list(range(10))
  assert list(batching.prefetch(iter([]), 2)) == []


def test_fingerprint_is_order_independent():
  assert input_pipeline.fingerprint(['b', 'a']) == input_pipeline.fingerprint(['a', 'b'])
  assert input_pipeline.fingerprint(['a']) != input_pipeline.fingerprint(['b'])


def test_device_gather_equals_host_batch_on_8_devices():
  """data.on_device: the devices gather exactly the host batch's rows, sharded the same way."""
  rng = np.random.default_rng(0)
  split = input_pipeline.Split(
    rng.integers(0, 256, (50, 4, 4, 3), dtype=np.uint8), rng.integers(0, 10, (50,), dtype=np.int32)
  )
  mesh = run.make_mesh()
  replicated, sharded = run.shardings(mesh)
  data = batching.on_devices(split, replicated)
  assert data['image'].sharding.is_fully_replicated and len(data['image'].devices()) == 8
  gather = run.make_gather(mesh)
  for step in (0, 3, 7):  # crosses an epoch boundary (6 batches of 8 per epoch)
    rows = batching.train_batch_indices(len(split), 8, 5, step)
    on_device = gather(data, batching.to_global(rows.astype(np.int32), sharded))
    host = batching.to_global(batching.train_batch(split, 8, 5, step), sharded)
    for key in ('image', 'label'):
      assert on_device[key].sharding.is_equivalent_to(host[key].sharding, host[key].ndim)
      np.testing.assert_array_equal(np.asarray(on_device[key]), np.asarray(host[key]))


def test_batches_are_the_same_bytes_for_any_number_of_feed_workers(tmp_path):
  """The threaded gather from a memory-mapped .npy (as the CelebA cache) gives each step the bytes
  one worker gives, for 2..12 workers (more than rows): a batch stays a function of (seed, step)."""
  rng = np.random.default_rng(0)
  np.save(tmp_path / 'train.npy', rng.integers(0, 256, (37, 6, 5, 3), dtype=np.uint8))
  split = input_pipeline.Split(
    np.load(tmp_path / 'train.npy', mmap_mode='r'), rng.integers(0, 10, (37,), dtype=np.int32)
  )
  for step in (0, 4, 5):  # crosses an epoch boundary (4 batches of 9 per epoch)
    one = batching.train_batch(split, 9, 3, step, workers=1)
    rows = batching.train_batch_indices(37, 9, 3, step)
    np.testing.assert_array_equal(one['image'], np.asarray(split.images)[rows])
    for workers in (2, 3, 7, 12):
      many = batching.train_batch(split, 9, 3, step, workers=workers)
      assert many['image'].tobytes() == one['image'].tobytes()
      np.testing.assert_array_equal(many['label'], one['label'])


def test_device_resident_split_must_fit_half_a_device():
  config = digits.get_config('smoke')
  config.batch_size = 8
  split = _split(64)  # 64 one-pixel images + 64 int32 labels = 320 bytes
  sizes = len(split), batching.nbytes(split)
  config.data.on_device = True
  validation.check_dataset(config, *sizes, device_bytes=1024)  # fits: 320 <= 512
  with pytest.raises(
    validation.ConfigError,
    match=r'config.data.on_device=True needs .* GiB .* '
    r'set config.data.on_device=False',
  ):
    validation.check_dataset(config, *sizes, device_bytes=600)
  validation.check_dataset(config, *sizes, device_bytes=None)  # CPU: no limit reported
  config.data.on_device = False
  validation.check_dataset(config, *sizes, device_bytes=600)  # host feeding: no limit


class _Device:
  def __init__(self, stats):
    self.stats = stats

  def memory_stats(self):
    if isinstance(self.stats, Exception):
      raise self.stats
    return self.stats


def test_device_memory_is_the_smallest_reported_limit():
  assert process.device_memory([_Device({'bytes_limit': 8}), _Device({'bytes_limit': 5})]) == 5
  assert process.device_memory([_Device(None), _Device(RuntimeError('n/a'))]) is None


def test_gather_of_a_strided_view_copies_only_the_rows_it_takes():
  """A stride-0 view (bench_step's epoch images) is gathered row by row: np.take would first copy
  the whole view contiguous (CelebA at 224 px: 23 GiB, which killed the GPU's epoch benchmark)."""
  import tracemalloc

  image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(1, 8, 8, 3)
  view = np.broadcast_to(image, (200_000, 8, 8, 3))  # 38 MiB if made contiguous
  rows = np.array([3, 5, 199_999])
  tracemalloc.start()
  try:
    got = batching.gather(view, rows, workers=2)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 2**20, peak
  np.testing.assert_array_equal(got, np.repeat(image, 3, axis=0))
  strided = np.arange(6 * 4 * 4 * 3, dtype=np.uint8).reshape(6, 4, 4, 3)[:, ::2]
  np.testing.assert_array_equal(batching.gather(strided, np.array([4, 0])), strided[[4, 0]])
