"""CelebA at full size, dry run: preparation, decoding, memory and disk on a generated fixture.

  nice -n 10 python -m benchmarks.bench_celeba_full --workdir /tmp/celeba_full --image-size 128

Generates (or reuses, when `--workdir`/files already holds one) a CelebA-format fixture of the real
size: 202,599 JPEGs of 218x178 of 10,177 identities in the five official file formats
(`input_pipeline.celeba_fixture`; synthetic images, larger JPEGs than CelebA's ~7 KB), then runs
one cold `celeba.load` (config `celeba.py:smoke` at `--image-size`) in this process and times its
phases by wrapping the functions `load` calls:

  metadata      celeba_files.read_metadata: parse and check the five files
  fingerprint   celeba_files.source_fingerprint: hash of the zip index and the txt files
  split         celeba._split: the per-identity split of every image
  prepare       celeba_tfds.prepare: TFDS celeb_a 2.1.0 written from the zip (TF import included)
  decode        celeba.write_cache: every image read back from TFDS, decoded, resized, written

then a cached load (no decoding) and `--gather-steps` training batches gathered from the memmap.
A thread samples /proc/self/status every 0.2 s: the peak RSS per phase, and its anonymous part
(RssAnon: heap, buffers; what memory pressure cannot drop) and file part (RssFile: mapped file
pages, dropped under pressure). `ru_maxrss` is the whole process's peak. Disk: the bytes of the
zip, the prepared TFDS folder and the decoded cache. Everything generated is deleted at the end
unless `--keep`. The environment line comes last: it starts the JAX backend, which the peaks
above should not include.
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import contextlib
import functools
import os
import resource
import shutil
import threading
import time

from benchmarks import common


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_celeba_full', description=common.description(__doc__)
  )
  parser.add_argument(
    '--workdir', required=True, help='fixture, TFDS and cache go here (local disk)'
  )
  parser.add_argument(
    '--images', type=int, default=202599, help="images of the fixture (default: CelebA's)"
  )
  parser.add_argument(
    '--identities', type=int, default=10177, help="identities (default: CelebA's)"
  )
  parser.add_argument('--image-size', type=int, default=128, help='data.image_size')
  parser.add_argument('--batch', type=int, default=256, help='images per gathered batch')
  parser.add_argument(
    '--gather-steps', type=int, default=200, help='batches gathered after loading'
  )
  parser.add_argument('--keep', action='store_true', help='keep the generated files')
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load numpy and JAX
  make_parser().parse_args()

import numpy as np

from configs import celeba as celeba_config
from input_pipeline import batching, celeba, celeba_files, celeba_fixture, celeba_tfds

MIB = 2**20


def status_mib():
  """{'rss', 'anon', 'file'} of this process now, MiB (from /proc/self/status)."""
  fields = {}
  with open('/proc/self/status') as f:
    for line in f:
      key, _, value = line.partition(':')
      fields[key] = value

  def kib(key):
    return int(fields[key].split()[0]) / 1024 if key in fields else float('nan')

  return {'rss': kib('VmRSS'), 'anon': kib('RssAnon'), 'file': kib('RssFile')}


class Phases:
  """Wall and CPU seconds per phase, and the peak RSS (total, anon, file) sampled while it ran.

  Phases nest (a load's own phases run inside it): each open phase keeps its own peak.
  """

  def __init__(self):
    self.rows, self.open = [], []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()

  def _sample(self):
    while not self._stop.wait(0.2):
      self._update()

  def _update(self):
    now = status_mib()
    for peak in list(self.open):
      for key, value in now.items():
        peak[key] = max(peak[key], value)

  @contextlib.contextmanager
  def phase(self, name, images=None):
    peak = status_mib()
    self.open.append(peak)
    start, cpu = time.perf_counter(), time.process_time()
    try:
      yield
    finally:
      self._update()
      self.open.pop()  # phases nest: the last one opened closes first
      label = '· ' * len(self.open) + name
      self.rows.append(
        (label, time.perf_counter() - start, time.process_time() - cpu, peak, images)
      )

  def wrap(self, module, attribute, name, images=None):
    """Make `module.attribute` (a function) run as phase `name`."""
    original = getattr(module, attribute)

    @functools.wraps(original)
    def timed(*args, **kwargs):
      with self.phase(name, images):
        return original(*args, **kwargs)

    setattr(module, attribute, timed)

  def close(self):
    self._stop.set()
    self._thread.join()


def folder_bytes(path):
  """Bytes the files under `path` take on disk (allocated blocks, as `du`)."""
  total = 0
  for folder, _, files in os.walk(path):
    total += sum(os.stat(os.path.join(folder, f)).st_blocks * 512 for f in files)
  return total


def ensure_fixture(manual_dir, args, phases):
  """Generate the fixture unless `manual_dir` already holds one (its partition file is written
  last, so a fixture killed mid-way is generated again); a reused one loses its TFDS and cache."""
  if os.path.exists(os.path.join(manual_dir, celeba_files.PARTITION)):
    print(
      f'reusing the fixture in {manual_dir} (its tfds/ deleted: the first load is cold)', flush=True
    )
    shutil.rmtree(os.path.join(manual_dir, 'tfds'), ignore_errors=True)
    return
  with phases.phase('generate fixture (not part of a load)', args.images):
    celeba_fixture.generate(
      manual_dir,
      args.identities,
      seed=0,
      images=args.images,
      progress=lambda done, total: print(f'  generated {done}/{total}', flush=True),
    )


def print_table(phases, title):
  print(f'\n{title}')
  print(
    '| phase | wall s | CPU s | images/s (wall) | peak RSS MiB | peak anon MiB | peak file MiB |'
  )
  print('|---|---:|---:|---:|---:|---:|---:|')
  for name, wall, cpu, peak, images in phases.rows:
    rate = f'{images / wall:,.0f}' if images else '-'
    print(
      f'| {name} | {wall:,.1f} | {cpu:,.1f} | {rate} | {peak["rss"]:,.0f} | {peak["anon"]:,.0f} '
      f'| {peak["file"]:,.0f} |'
    )


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  print(common.command_line('bench_celeba_full', argv))
  manual_dir = os.path.join(args.workdir, 'files')
  phases = Phases()
  try:
    ensure_fixture(manual_dir, args, phases)
    for module, attribute, name in (
      (celeba_files, 'read_metadata', 'metadata'),
      (celeba_files, 'source_fingerprint', 'fingerprint'),
      (celeba, '_split', 'split'),
      (celeba_tfds, 'prepare', 'prepare (TFDS)'),
      (celeba, 'write_cache', 'decode + write cache'),
    ):
      phases.wrap(
        module, attribute, name, args.images if name.startswith(('prepare', 'decode')) else None
      )
    config = celeba_config.get_config('smoke')
    config.data.manual_dir, config.data.image_size = manual_dir, args.image_size
    with phases.phase('first load (all of the above)', args.images):
      data = celeba.load(config)
    with phases.phase('cached load (no decoding)'):
      data = celeba.load(config)
    with phases.phase(
      f'gather {args.gather_steps} batches of {args.batch}', args.gather_steps * args.batch
    ):
      for step in range(args.gather_steps):
        batching.train_batch(data.train, args.batch, seed=0, step=step)
    tfds_dir = os.path.join(manual_dir, 'tfds')
    print_table(
      phases,
      f'{len(data.train) + len(data.test):,} images ({len(data.train):,} train, '
      f'{len(data.test):,} test), {data.info["num_identities"]:,} identities, '
      f'{args.image_size} px, {len(os.sched_getaffinity(0))} cores',
    )
    cache = data.info['decoded_cache']
    expected = (len(data.train) + len(data.test)) * args.image_size**2 * 3
    print(
      f'\nzip {os.path.getsize(os.path.join(manual_dir, celeba_files.ZIP)) / MIB:,.0f} MiB | '
      f'TFDS {folder_bytes(celeba_tfds.dataset_dir(tfds_dir)) / MIB:,.0f} MiB | decoded cache '
      f'{folder_bytes(cache) / MIB:,.0f} MiB (N x {args.image_size}^2 x 3 = {expected / MIB:,.0f}'
      f' MiB) | process peak RSS (ru_maxrss) '
      f'{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB'
    )
    print(f'train images mean {np.asarray(data.train.images[:64]).mean():.1f} (sanity)')
    print(common.environment())  # after the measurements: it starts the JAX backend
  finally:
    phases.close()
    if not args.keep:
      shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == '__main__':
  main()
