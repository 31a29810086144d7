"""Deterministic, per-process batching of a `Split`, and prefetching to the devices."""

import collections
import concurrent.futures
import os

import jax
import numpy as np


def epoch_permutation(num_examples, seed, epoch):
  """The order of the training examples in `epoch`; depends only on (seed, epoch, num_examples)."""
  rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), 0x5EED])
  return rng.permutation(num_examples)


def process_slice(global_batch, process_index, process_count):
  """Rows [start, stop) of a global batch that `process_index` reads."""
  if global_batch % process_count:
    raise ValueError(f'batch {global_batch} is not divisible by {process_count} processes')
  per_process = global_batch // process_count
  return process_index * per_process, (process_index + 1) * per_process


def steps_per_epoch(num_examples, batch_size):
  """Full batches per epoch; the last partial batch is dropped, as in the reference study."""
  return num_examples // batch_size


def train_batch_indices(num_examples, batch_size, seed, step, process_index=0, process_count=1):
  """Indices (into the train split) of this process's part of global batch number `step`."""
  per_epoch = steps_per_epoch(num_examples, batch_size)
  epoch, index = divmod(step, per_epoch)
  order = epoch_permutation(num_examples, seed, epoch)
  rows = order[index * batch_size : (index + 1) * batch_size]
  start, stop = process_slice(batch_size, process_index, process_count)
  return np.sort(rows[start:stop])  # sorted: sequential reads from a memory map


# Threads gathering each batch's images (numpy's take copies without the GIL): a TPU host's feed
# needs several cores (docs/performance.md "The host feed"); 32 at most (the v6e-8 host needs 24).
FEED_WORKERS = min(32, len(os.sched_getaffinity(0)))


def gather(array, rows, workers=None):
  """array[rows], copied by `workers` threads (FEED_WORKERS), a contiguous part of `rows` each: the
  same bytes for any count."""
  out = np.empty((len(rows),) + array.shape[1:], array.dtype)
  bounds = np.linspace(0, len(rows), (workers or FEED_WORKERS) + 1).astype(int)

  def copy(lo, hi):
    if array.flags.c_contiguous:
      np.take(array, rows[lo:hi], axis=0, out=out[lo:hi])
    else:  # take would first copy all of `array` contiguous (a stride-0 view of CelebA: 23 GiB)
      out[lo:hi] = array[rows[lo:hi]]

  with concurrent.futures.ThreadPoolExecutor(len(bounds) - 1) as pool:
    list(pool.map(copy, bounds[:-1], bounds[1:]))
  return out


def train_batch(split, batch_size, seed, step, process_index=0, process_count=1, workers=None):
  """This process's part of training batch `step` as numpy: {'image': uint8, 'label': ...}."""
  idx = train_batch_indices(len(split), batch_size, seed, step, process_index, process_count)
  return {'image': gather(split.images, idx, workers), 'label': np.asarray(split.labels[idx])}


def eval_batch_size(num_examples, batch_size, multiple=1):
  """The global evaluation batch: as few batches as `batch_size` allows, of one size, a multiple
  of `multiple` (the devices)."""
  batches = -(-num_examples // batch_size)
  per_batch = -(-num_examples // max(batches, 1))
  return max(multiple, min(batch_size, -(-per_batch // multiple) * multiple))


def eval_batches(split, batch_size, process_index=0, process_count=1):
  """Every example of `split` once, in order, in global batches of `batch_size` (the last
  masked)."""
  n = len(split)
  start, stop = process_slice(batch_size, process_index, process_count)
  for begin in range(0, n, batch_size):
    rows = np.arange(begin + start, begin + stop)
    mask = (rows < n).astype(np.float32)
    rows = np.where(rows < n, rows, 0)
    yield {
      'image': np.asarray(split.images[rows]),
      'label': np.asarray(split.labels[rows]),
      'mask': mask,
    }


def num_eval_batches(num_examples, batch_size):
  return -(-num_examples // batch_size)


def to_global(batch, sharding):
  """Assemble per-process numpy arrays into global jax.Arrays sharded by `sharding`."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def on_devices(split, sharding):
  """The whole `split` as global jax.Arrays {'image', 'label'} laid out by `sharding`."""

  def put(array):
    return jax.make_array_from_callback(
      array.shape, sharding, lambda index: np.ascontiguousarray(array[index])
    )

  return {'image': put(split.images), 'label': put(split.labels)}


def nbytes(split):
  """Bytes the split's images and labels take (on each device, when kept there)."""
  return int(split.images.nbytes) + int(split.labels.nbytes)


def train_batches(
  split, batch_size, seed, start_step, stop_step, sharding, prefetch_size=2, on_device=None
):
  """Global device batches for steps [start_step, stop_step), prepared ahead on a thread."""

  def produce():
    for step in range(start_step, stop_step):
      if on_device:
        data, gather = on_device
        rows = train_batch_indices(
          len(split), batch_size, seed, step, jax.process_index(), jax.process_count()
        )
        yield gather(data, to_global(rows.astype(np.int32), sharding))
      else:
        yield to_global(
          train_batch(split, batch_size, seed, step, jax.process_index(), jax.process_count()),
          sharding,
        )

  return prefetch(produce(), prefetch_size)


def prefetch(iterator, size=2):
  """Run `iterator` (which should already produce device arrays) `size` items ahead in a thread."""
  if size <= 0:
    yield from iterator
    return
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    queue = collections.deque()
    it = iter(iterator)

    def submit():
      queue.append(pool.submit(next, it, StopIteration))

    for _ in range(size):
      submit()
    while True:
      item = queue.popleft().result()
      if item is StopIteration:
        return
      submit()
      yield item
