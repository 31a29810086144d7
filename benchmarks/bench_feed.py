"""The training step fed as the trainer feeds it, against the same step on one resident batch.

  python -m benchmarks.bench_feed --config configs/celeba.py:gpu --batch 256 \
      --compute-dtype bfloat16                                                       # GPU
  python -m benchmarks.bench_feed --images /data/celeba_cache/<key>/train.npy ...    # real files
  python -m benchmarks.bench_feed                                                    # CPU, 64^2

The config and the step are bench_step's (`--config` and its shorthand flags; the trainer's step
built by the run context on a dataset of these images, compiled once). Three feeds run in
alternating timed windows of `--steps` steps, in one process:

  synthetic  one batch already on the device, reused (what bench_step measures)
  host       the trainer's default path (run.batches): each batch's rows gathered from a
             memory-mapped uint8 .npy (the decoded CelebA cache's format), on a prefetch thread
             (`--prefetch`: data.prefetch), and put on the devices; after each step the trainer's
             non-finite watch (run.watch) runs
  device     config.data.on_device (run.feed): the split lives on the devices, only row indices
             travel, the devices gather; the watch runs too

The images: `--images PATH` (a uint8 [N, H, W, 3] .npy, e.g. the CelebA cache's train.npy, opened
as a memory map like the trainer opens it), or, by default, `--examples` random images written to
such a file in a temporary folder (first reads come from disk, later ones from the page cache).
Prints a table; the last line is `real_vs_synthetic=<float>`: images/s of the faster real feed
over images/s of the synthetic one (1.0 = feeding costs nothing; the goal is >= 0.95).
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import functools
import os
import statistics
import tempfile
import time

from benchmarks import common, step_args


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_feed', description=common.description(__doc__)
  )
  step_args.add_args(parser)
  parser.add_argument('--images', default='', help='uint8 [N,H,W,3] .npy to feed from')
  parser.add_argument(
    '--examples',
    type=int,
    default=0,
    help='random images written when no --images (default: 8 batches)',
  )
  parser.add_argument('--prefetch', type=int, help='data.prefetch (batches prepared ahead)')
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  step_args.parse_flags(make_parser(), None)

import jax
import numpy as np

from benchmarks import bench_step
from input_pipeline import batching
from trainer import run

FEEDS = ('synthetic', 'host', 'device')


def open_images(args, config, directory):
  """The uint8 [N, H, W, 3] memmap to feed from: `--images`, or random images written to disk."""
  size = config.data.image_size
  if args.images:
    images = np.load(args.images, mmap_mode='r')
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:3] != (size,) * 2:
      common.fail(
        f'--images {args.images}: need uint8 [N, {size}, {size}, 3] '
        f'(data.image_size {size}), got {images.dtype} {images.shape}'
      )
    return images
  path = os.path.join(directory, 'train.npy')
  examples = args.examples or 8 * config.batch_size
  out = np.lib.format.open_memmap(path, 'w+', np.uint8, (examples, size, size, 3))
  rng = np.random.default_rng(0)
  for begin in range(0, examples, 1024):  # chunks: bounded host memory at any size
    stop = min(begin + 1024, examples)
    out[begin:stop] = rng.integers(0, 256, (stop - begin,) + out.shape[1:], dtype=np.uint8)
  out.flush()
  del out
  return np.load(path, mmap_mode='r')


class Feeds:
  """The step of `bench` driven by each feed; `run(feed, n)` times n steps of one feed."""

  def __init__(self, bench):
    ctx = bench.ctx
    self.bench = bench
    self.watch, self.bad = run.watch(ctx, bench.state)
    endless = 1 << 40  # the generators run as long as the benchmark does
    self.batches = {
      'host': run.batches(ctx, 0, endless),
      'device': run.batches(ctx, 0, endless, run.feed(ctx, on_device=True)),
    }
    self.split_bytes = batching.nbytes(ctx.dataset.train)

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
  runners = {feed: functools.partial(feeds.run, feed) for feed in FEEDS}
  return common.alternate(runners, args.warmup, args.windows, args.steps)


def table(times, batch):
  synthetic = batch / statistics.median(times['synthetic'])
  lines = ['| feed | ms/step median (min-max) | images/s | vs synthetic |', '|---|---|---|---|']
  ratios = {}
  for feed in FEEDS:
    ms = statistics.median(times[feed]) * 1e3
    ips = batch / (ms / 1e3)
    ratios[feed] = ips / synthetic
    lines.append(
      f'| {feed} | {ms:.2f} ({min(times[feed]) * 1e3:.2f}-{max(times[feed]) * 1e3:.2f})'
      f' | {ips:.1f} | {ratios[feed]:.3f} |'
    )
  return '\n'.join(lines), ratios


def shorthand_overrides(args):
  """bench_step's shorthand flags, plus --prefetch (data.prefetch)."""
  return step_args.shorthand_overrides(
    args, step_args.SHORTHANDS + (('prefetch', 'data.prefetch'),)
  )


def main(argv=None):
  args, config = step_args.parse(make_parser(), argv, shorthand_overrides)
  print(common.environment())
  print(common.command_line('bench_feed', argv))
  devices = bench_step.selected_devices(args)
  with tempfile.TemporaryDirectory(prefix='bench_feed_') as directory:
    images = open_images(args, config, directory)
    dataset = bench_step.image_dataset(
      'feed', images, args.num_classes, config.batch_size, np.random.default_rng(1)
    )
    bench = bench_step.build_step(config, devices, dataset)
    feeds = Feeds(bench)
    times = measure(feeds, args)
  text, ratios = table(times, config.batch_size)
  print(
    f'{len(images)} images {images.shape[1:]} uint8 ({feeds.split_bytes / 2**30:.2f} GiB, '
    f'{"--images" if args.images else "random, memory-mapped"}), global batch '
    f'{config.batch_size} on {len(devices)} device(s), prefetch {config.data.prefetch}, '
    f'{args.windows} windows x {args.steps} steps per feed, alternating'
  )
  print(text)
  best = max(('host', 'device'), key=ratios.get)
  print(f'faster real feed: {best}')
  print(f'real_vs_synthetic={ratios[best]:.4f}')


if __name__ == '__main__':
  main()
