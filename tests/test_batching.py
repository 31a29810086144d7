"""Deterministic per-process batching: every example once per epoch, eval without drops."""

import numpy as np

from input_pipeline import base, batching


def _split(n):
  images = np.arange(n, dtype=np.uint8).reshape(n, 1, 1, 1)
  return base.Split(images, np.arange(n, dtype=np.int32))


def test_train_batches_cover_each_example_at_most_once_per_epoch_for_any_process_count():
  n, batch = 103, 8
  per_epoch = batching.steps_per_epoch(n, batch)
  for processes in (1, 2, 4):
    seen = np.concatenate([
        batching.train_batch_indices(n, batch, seed=3, step=s, process_index=p,
                                     process_count=processes)
        for s in range(per_epoch, 2 * per_epoch) for p in range(processes)])
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
  assert batching.fingerprint(['b', 'a']) == batching.fingerprint(['a', 'b'])
  assert batching.fingerprint(['a']) != batching.fingerprint(['b'])
