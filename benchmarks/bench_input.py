"""The CelebA input pipeline alone, on a generated CelebA-format fixture of 218x178 JPEGs: a cold
load (parse, prepare, decode) and a cached one, then gathered batches; per phase the wall and CPU
seconds, images per second of each (per CPU-second: one core's rate) and the peak memory.

  nice -n 10 python -m benchmarks.bench_input --full --workdir /tmp/celeba_full --image-size 128
  python -m benchmarks.bench_input --feed 4 --batch 1024   # the host feed, workers 1..4, 224 px

The fixture goes to WORKDIR/files (one there is read, not changed).
Reference: docs/performance.md.
"""

import contextlib
import functools
import os
import resource
import shutil
import tempfile
import threading
import time

import numpy as np

from benchmarks import common
from configs import celeba as celeba_config
from input_pipeline import celeba, celeba_fixture, celeba_tfds

MIB = 2**20
CELEBA = (202_599, 10_177)  # images, identities
# Images/s one host must feed for configs/celeba.py:tpu to run at the roofline: the frozen step's
# (the faster) of the preflight's table in docs/tpu.md (compiled for each type, not executed).
NEEDED = {'v4-8': 24_434, 'v5e-8': 30_960, 'v5p-8': 58_638, 'v6e-8': 65_983}


def feed(args, workdir):
  """Training batches gathered from a memory-mapped uint8 .npy (the decoded cache's format) of
  --feed-images at --image-size, in page cache, by 1..--feed workers: images/s, per worker."""
  from input_pipeline import Split, batching  # JAX: not for --help

  path, size, rows = os.path.join(workdir, 'feed.npy'), args.image_size, []
  shape = (args.feed_images, size, size, 3)
  array = np.lib.format.open_memmap(path, mode='w+', dtype=np.uint8, shape=shape)
  for start in range(0, len(array), 1024):  # random bytes, in parts (not all in memory)
    part = array[start : start + 1024]
    part[:] = np.random.default_rng(start).integers(0, 256, part.shape, np.uint8)
  array.flush()
  split = Split(np.load(path, mmap_mode='r'), np.zeros(len(array), np.int32))
  try:
    for workers in range(1, args.feed + 1):
      batching.train_batch(split, args.batch, 0, 0, workers=workers)  # warm: page cache
      start = time.perf_counter()
      for step in range(args.gather_steps):
        batching.train_batch(split, args.batch, 0, step, workers=workers)
      rate = args.gather_steps * args.batch / (time.perf_counter() - start)
      needs = ', '.join(f'{t} {n * workers / rate:.0f}' for t, n in NEEDED.items())
      gbps = rate * size**2 * 3 / 1e9
      rows.append([workers, f'{rate:,.0f}', f'{rate / workers:,.0f}', f'{gbps:.2f}', needs])
  finally:
    if not args.keep:
      os.remove(path)
  per_worker = 'workers needed at this rate per worker'
  print(common.table(['workers', 'images/s', 'per worker', 'GB/s', per_worker], rows))
  needed = ', '.join(f'{t} {n:,}' for t, n in NEEDED.items())
  print(
    f'needed at the roofline, images/s per host (docs/tpu.md: compiled, not executed): {needed}'
  )
  print(f'{len(os.sched_getaffinity(0))} cores here, load {os.getloadavg()[0]:.1f} (1 min)')


def status_mib():
  """{'rss', 'anon', 'file'} of this process now, MiB (/proc/self/status)."""
  with open('/proc/self/status') as f:
    fields = dict(line.partition(':')[::2] for line in f)
  keys = {'rss': 'VmRSS', 'anon': 'RssAnon', 'file': 'RssFile'}
  return {
    k: float(fields[v].split()[0]) / 1024 if v in fields else float('nan') for k, v in keys.items()
  }


class Phases:
  """Wall and CPU seconds per phase and the peak RSS (total, anonymous, file pages) sampled every
  0.2 s while it ran; phases nest, each keeping its own peak."""

  def __init__(self):
    self.rows, self.open, self._stop = [], [], threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()

  def _sample(self):
    while not self._stop.wait(0.2):
      self._update()

  def _update(self):
    now = status_mib()
    for peak in list(self.open):
      peak.update({k: max(peak[k], v) for k, v in now.items()})

  @contextlib.contextmanager
  def phase(self, name, images=None):
    peak, start, cpu = status_mib(), time.perf_counter(), time.process_time()
    self.open.append(peak)
    try:
      yield
    finally:
      self._update()
      self.open.pop()  # the last one opened closes first
      wall, cpu = time.perf_counter() - start, time.process_time() - cpu
      self.rows.append(('· ' * len(self.open) + name, wall, cpu, peak, images))

  def wrap(self, module, attribute, name, images=None):
    """`module.attribute` (a function) runs as phase `name` from now on."""
    original = getattr(module, attribute)

    @functools.wraps(original)
    def timed(*args, **kwargs):
      with self.phase(name, images):
        return original(*args, **kwargs)

    setattr(module, attribute, timed)

  def close(self):
    self._stop.set()
    self._thread.join()

  def table(self):
    rows = []
    for name, wall, cpu, peak, images in self.rows:
      rates = [f'{images / s:,.0f}' if images and s > 0 else '-' for s in (wall, cpu)]
      memory = [f'{peak[k]:,.0f}' for k in ('rss', 'anon', 'file')]
      rows.append([name, f'{wall:,.1f}', f'{cpu:,.1f}', *rates, *memory])
    header = ['phase', 'wall s', 'CPU s', 'images/s (wall)', 'images per CPU-s', 'peak RSS MiB']
    return common.table([*header, 'peak anon MiB', 'peak file MiB'], rows)


def folder_bytes(path):
  """Bytes the files under `path` take on disk (allocated blocks, as `du`)."""
  walk = os.walk(path)
  return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, names in walk for f in names)


def measure(args, workdir, phases):
  from input_pipeline import batching  # JAX: not for --help

  manual_dir = os.path.join(workdir, 'files')
  # A fixture (or CelebA) there is read as it is; a folder holding other files is refused.
  generated = not os.path.exists(os.path.join(manual_dir, celeba.PARTITION))
  if not generated:
    print(f'reading the fixture in {manual_dir} (not changed)', flush=True)
  elif os.path.exists(manual_dir) and os.listdir(manual_dir):
    common.fail(f'--workdir: {manual_dir} holds files but no fixture; give another --workdir')
  else:

    def progress(done, total):
      print(f'  generated {done}/{total}', flush=True)

    with phases.phase('generate fixture (not part of a load)', args.images):
      kwargs = dict(seed=0, images=args.images, progress=progress)
      celeba_fixture.generate(manual_dir, args.identities, args.max_images, **kwargs)
  scratch = tempfile.mkdtemp(prefix='bench_input_', dir=workdir)  # this run's TFDS and cache
  try:
    config = celeba_config.get_config('smoke')
    config.data.manual_dir, config.data.tfds_dir = manual_dir, os.path.join(scratch, 'tfds')
    config.data.image_size = args.image_size
    with open(os.path.join(manual_dir, celeba.PARTITION)) as f:
      images = sum(1 for _ in f)
    phases.wrap(celeba, 'read_metadata', 'metadata')
    phases.wrap(celeba, 'source_fingerprint', 'fingerprint')
    phases.wrap(celeba, '_split', 'split')
    phases.wrap(celeba_tfds, 'prepare', 'prepare (TFDS)', images)
    phases.wrap(celeba, 'write_cache', 'decode + write cache', images)
    with phases.phase('first load (all of the above)', images):
      data = celeba.load(config)
    with phases.phase('cached load (no decoding)'):
      data = celeba.load(config)
    batch = min(args.batch, len(data.train))
    with phases.phase(f'gather {args.gather_steps} batches of {batch}', args.gather_steps * batch):
      for step in range(args.gather_steps):
        batching.train_batch(data.train, batch, seed=0, step=step)
    n, size = len(data.train) + len(data.test), args.image_size
    print(
      f'\n{n:,} images ({len(data.train):,} train, {len(data.test):,} test), '
      f'{data.info["num_identities"]:,} identities, {size} px, '
      f'{len(os.sched_getaffinity(0))} cores ({os.cpu_count()} on the machine)'
    )
    print(phases.table())
    zip_mib = os.path.getsize(os.path.join(manual_dir, celeba.ZIP)) / MIB
    tfds_mib = folder_bytes(celeba_tfds.dataset_dir(config.data.tfds_dir)) / MIB
    cache_mib = folder_bytes(data.info['decoded_cache']) / MIB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
      f'\nzip {zip_mib:,.0f} MiB | TFDS {tfds_mib:,.0f} MiB | decoded cache {cache_mib:,.0f} MiB '
      f'(N x {size}^2 x 3 = {n * size**2 * 3 / MIB:,.0f} MiB) | process peak RSS (ru_maxrss) '
      f'{peak:,.0f} MiB'
    )
    print(f'train images mean {np.asarray(data.train.images[:64]).mean():.1f} (sanity)')
  finally:
    if not args.keep:  # only what this run wrote
      shutil.rmtree(scratch, ignore_errors=True)
      if generated:
        shutil.rmtree(manual_dir, ignore_errors=True)


def main(argv=None):
  parser = common.parser('bench_input', __doc__)
  parser.add_argument('--workdir', help='the fixture goes to WORKDIR/files (default: a temp dir)')
  parser.add_argument('--full', action='store_true', help="CelebA's size: 202,599 images")
  parser.add_argument('--images', type=int, help='images of the fixture (default: random counts)')
  parser.add_argument('--identities', type=int, help='identities (default 40; --full: 10,177)')
  parser.add_argument('--max-images', type=int, default=12, help='images per identity at most')
  parser.add_argument('--image-size', type=int, default=224, help='data.image_size')
  parser.add_argument('--batch', type=int, default=256, help='images per gathered batch')
  parser.add_argument('--gather-steps', type=int, default=200, help='batches gathered')
  parser.add_argument('--keep', action='store_true', help='keep the fixture, TFDS and cache')
  parser.add_argument('--feed', type=int, help='only the host feed: workers 1..FEED')
  parser.add_argument('--feed-images', type=int, default=4096, help='images the feed reads from')
  args = parser.parse_args(argv)
  images, identities = CELEBA if args.full else (None, 40)
  args.images, args.identities = args.images or images, args.identities or identities
  positive = (args.identities, args.max_images, args.image_size, args.batch, args.gather_steps)
  if args.feed is not None and not (args.feed > 0 and args.feed_images >= args.batch):
    common.fail('--feed must be positive and --feed-images at least --batch')
  if min(positive) < 1 or (args.images or args.identities) < args.identities:
    common.fail(
      '--identities, --max-images, --image-size, --batch and --gather-steps must be positive, '
      '--images at least --identities'
    )
  common.command_line('bench_input', argv, None)
  workdir = args.workdir or tempfile.mkdtemp(prefix='bench_input_')
  created = args.workdir is None or not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  phases = Phases()
  try:
    if args.feed:
      feed(args, workdir)
    else:
      measure(args, workdir, phases)
  finally:
    phases.close()
    if created and not args.keep:
      with contextlib.suppress(OSError):
        os.rmdir(workdir)  # empty now: this run made it
  print(common.environment())  # last: it starts the JAX backend, which the peaks leave out


if __name__ == '__main__':
  main()
