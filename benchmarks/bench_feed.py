"""The training step fed as the trainer feeds it, against the same step on one resident batch.

  python -m benchmarks.bench_feed --image-size 224 --batch 256 --compute-dtype bfloat16   # GPU
  python -m benchmarks.bench_feed --images /data/celeba_cache/<key>/train.npy ...          # real files
  python -m benchmarks.bench_feed                                                          # CPU, 64^2

The step is bench_step's (the project's own train step, compiled once). Three feeds run in
alternating timed windows of `--steps` steps, in one process:

  synthetic  one batch already on the device, reused (what bench_step measures)
  host       the trainer's default path: batching.train_batches gathers each batch's rows from a
             memory-mapped uint8 .npy (the decoded CelebA cache's format), on a prefetch thread,
             and puts it on the devices; after each step the trainer's non-finite watch runs
  device     config.data.on_device: the split lives on the devices, only row indices travel, the
             devices gather (batching.on_devices + steps.make_gather); the watch runs too

The images: `--images PATH` (a uint8 [N, H, W, 3] .npy, e.g. the CelebA cache's train.npy, opened
as a memory map like the trainer opens it), or, by default, `--examples` random images written to
such a file in a temporary folder (first reads come from disk, later ones from the page cache).
Prints a table; the last line is `real_vs_synthetic=<float>`: images/s of the faster real feed
over images/s of the synthetic one (1.0 = feeding costs nothing; the goal is >= 0.95).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ''):  # run as a file: make the repository importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import bench_step  # noqa: E402
from input_pipeline import base, batching  # noqa: E402
from trainer import steps  # noqa: E402

FEEDS = ('synthetic', 'host', 'device')


def open_images(args, directory):
  """The uint8 [N, H, W, 3] memmap to feed from: `--images`, or random images written to disk."""
  if args.images:
    images = np.load(args.images, mmap_mode='r')
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:3] != (args.image_size,) * 2:
      raise SystemExit(f'--images {args.images}: need uint8 [N, {args.image_size}, '
                       f'{args.image_size}, 3], got {images.dtype} {images.shape}')
    return images
  path = os.path.join(directory, 'train.npy')
  out = np.lib.format.open_memmap(path, 'w+', np.uint8,
                                  (args.examples, args.image_size, args.image_size, 3))
  rng = np.random.default_rng(0)
  for begin in range(0, args.examples, 1024):  # chunks: bounded host memory at any size
    stop = min(begin + 1024, args.examples)
    out[begin:stop] = rng.integers(0, 256, (stop - begin,) + out.shape[1:], dtype=np.uint8)
  out.flush()
  del out
  return np.load(path, mmap_mode='r')


class Feeds:
  """The step of `bench` driven by each feed; `run(feed, n)` times n steps of one feed."""

  def __init__(self, bench, images, args):
    if len(images) < args.batch:
      raise SystemExit(f'{len(images)} images: need at least one batch of {args.batch}')
    labels = np.random.default_rng(1).integers(0, args.num_classes, len(images), dtype=np.int32)
    split = base.Split(images, labels)
    mesh = steps.make_mesh(bench.devices)
    replicated, sharded = steps.shardings(mesh)
    self.bench = bench
    self.watch, self.bad = steps.make_watch(mesh), steps.no_bad_step(mesh)
    on_device = (batching.on_devices(split, replicated), steps.make_gather(mesh))
    endless = 1 << 40  # the generators run as long as the benchmark does
    self.batches = {
        'host': batching.train_batches(split, args.batch, 0, 0, endless, sharded, args.prefetch),
        'device': batching.train_batches(split, args.batch, 0, 0, endless, sharded, args.prefetch,
                                         on_device)}
    self.split_bytes = batching.nbytes(split)

  def run(self, feed, n):
    """Seconds for n steps of `feed`, the host blocking once at the end (as bench_step)."""
    if feed == 'synthetic':
      return self.bench.run(n)
    start = time.perf_counter()
    state, bad, batches = self.bench.state, self.bad, self.batches[feed]
    for _ in range(n):
      state = self.bench.step(state, next(batches))
      bad = self.watch(bad, state)
    jax.block_until_ready((state, bad))
    self.bench.state, self.bad = state, bad
    return time.perf_counter() - start


def measure(feeds, args):
  """{feed: [seconds per step of each window]}, windows alternating between the feeds."""
  for feed in FEEDS:
    feeds.run(feed, args.warmup)
  times = {feed: [] for feed in FEEDS}
  for _ in range(args.windows):
    for feed in FEEDS:
      times[feed].append(feeds.run(feed, args.steps) / args.steps)
  return times


def table(times, batch):
  synthetic = batch / statistics.median(times['synthetic'])
  lines = ['| feed | ms/step median (min-max) | images/s | vs synthetic |', '|---|---|---|---|']
  ratios = {}
  for feed in FEEDS:
    ms = statistics.median(times[feed]) * 1e3
    ips = batch / (ms / 1e3)
    ratios[feed] = ips / synthetic
    lines.append(f'| {feed} | {ms:.2f} ({min(times[feed]) * 1e3:.2f}-{max(times[feed]) * 1e3:.2f})'
                 f' | {ips:.1f} | {ratios[feed]:.3f} |')
  return '\n'.join(lines), ratios


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  bench_step.add_args(parser)
  parser.add_argument('--images', default='', help='uint8 [N,H,W,3] .npy to feed from')
  parser.add_argument('--examples', type=int, default=0,
                      help='random images written when no --images (default: 8 batches)')
  parser.add_argument('--prefetch', type=int, default=2, help='config.data.prefetch')
  args = parser.parse_args(argv)
  args.examples = args.examples or 8 * args.batch
  print(bench_step.environment())
  print(bench_step.command_line('bench_feed', argv))
  devices = bench_step.selected_devices(args)
  bench = bench_step.JaxStep(args, devices)
  with tempfile.TemporaryDirectory(prefix='bench_feed_') as directory:
    images = open_images(args, directory)
    feeds = Feeds(bench, images, args)
    times = measure(feeds, args)
  text, ratios = table(times, args.batch)
  print(f'{len(images)} images {images.shape[1:]} uint8 ({feeds.split_bytes / 2**30:.2f} GiB, '
        f'{"--images" if args.images else "random, memory-mapped"}), global batch {args.batch} on '
        f'{len(devices)} device(s), prefetch {args.prefetch}, {args.windows} windows x '
        f'{args.steps} steps per feed, alternating')
  print(text)
  best = max(('host', 'device'), key=ratios.get)
  print(f'faster real feed: {best}')
  print(f'real_vs_synthetic={ratios[best]:.4f}')


if __name__ == '__main__':
  main()
