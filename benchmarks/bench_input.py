"""The CelebA input pipeline alone, on a generated CelebA-format fixture (218x178 JPEGs).

  JAX_PLATFORMS=cpu python -m benchmarks.bench_input --identities 40 --image-size 224

Measures, and prints as a table, images per wall-clock second and per CPU-second of this process
(= images/s of one fully available core; robust to a busy, shared machine):
  decode, 1 thread        JPEG -> uint8 image_size^2 (PIL decode + bilinear squash): images/s
  decode, N threads       the same on a thread pool of N (the cold cache build uses all cores)
  first load (cold)       celeba.load with nothing prepared: TF import, TFDS prepare, decode, write
  cached load             celeba.load again: parse the txt files, open the memmaps (no decoding)
  cached batch gather     batching.train_batch over the memmap: images/s, one thread
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import concurrent.futures
import os
import tempfile
import time
import zipfile

from benchmarks import common


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_input', description=common.description(__doc__)
  )
  parser.add_argument('--identities', type=int, default=40, help='identities of the fixture')
  parser.add_argument('--max-images', type=int, default=12, help='images per identity at most')
  parser.add_argument('--image-size', type=int, default=224, help='data.image_size')
  parser.add_argument('--batch', type=int, default=256, help='images per gathered batch')
  parser.add_argument('--repeats', type=int, default=3, help='passes over the JPEGs when decoding')
  parser.add_argument(
    '--threads',
    type=int,
    default=len(os.sched_getaffinity(0)),
    help='decoding threads (default: the CPUs this process may use)',
  )
  parser.add_argument('--workdir', default='', help='where the fixture goes (default: a temp dir)')
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load numpy and JAX
  make_parser().parse_args()

import numpy as np

from configs import celeba as celeba_config
from input_pipeline import batching, celeba, celeba_files, celeba_fixture


def _jpegs(manual_dir):
  with zipfile.ZipFile(os.path.join(manual_dir, celeba_files.ZIP)) as zf:
    return [(os.path.basename(i.filename), zf.read(i)) for i in zf.infolist() if not i.is_dir()]


def _decode_rate(jpegs, size, threads, repeats):
  """(images per wall second, images per CPU second of this process) decoding on `threads`."""
  start, cpu = time.perf_counter(), time.process_time()
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for _ in range(repeats):
      list(pool.map(lambda item: celeba.decode(item[1], size, item[0]), jpegs))
  images = repeats * len(jpegs)
  return images / (time.perf_counter() - start), images / (time.process_time() - cpu)


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)

  workdir = args.workdir or tempfile.mkdtemp(prefix='bench_input_')
  manual_dir = os.path.join(workdir, 'files')
  celeba_fixture.generate(manual_dir, args.identities, args.max_images, seed=0)
  jpegs = _jpegs(manual_dir)
  rows = []
  rows.append(('decode, 1 thread', *_decode_rate(jpegs, args.image_size, 1, args.repeats)))
  rows.append(
    (
      f'decode, {args.threads} threads',
      *_decode_rate(jpegs, args.image_size, args.threads, args.repeats),
    )
  )

  config = celeba_config.get_config('smoke')
  config.data.manual_dir, config.data.image_size = manual_dir, args.image_size
  start, cpu = time.perf_counter(), time.process_time()
  data = celeba.load(config)
  rows.append(
    (
      'first load (cold: TF import, prepare, decode)',
      len(jpegs) / (time.perf_counter() - start),
      len(jpegs) / (time.process_time() - cpu),
    )
  )
  start = time.perf_counter()
  data = celeba.load(config)
  rows.append(('cached load (no decoding)', len(jpegs) / (time.perf_counter() - start), None))

  batch = min(args.batch, len(data.train))
  steps = max(1, 20 * len(data.train) // batch)
  start, cpu = time.perf_counter(), time.process_time()
  for step in range(steps):
    batching.train_batch(data.train, batch, seed=0, step=step)
  rows.append(
    (
      f'cached batch gather (batch {batch})',
      steps * batch / (time.perf_counter() - start),
      steps * batch / (time.process_time() - cpu),
    )
  )

  print(
    f'\n{len(jpegs)} JPEGs of 218x178 -> {args.image_size}x{args.image_size}, '
    f'{args.threads} cores available ({os.cpu_count()} on the machine)'
  )
  print(f'| {"stage":<46} | {"images/s":>10} | {"per CPU-s":>10} |')
  print(f'|{"-" * 48}|{"-" * 11}:|{"-" * 11}:|')
  for name, rate, per_core in rows:
    per = f'{per_core:10.0f}' if per_core is not None else f'{"-":>10}'
    print(f'| {name:<46} | {rate:10.0f} | {per} |')
  print(
    f'decoded cache: {data.info["decoded_cache"]} '
    f'({np.prod(data.train.images.shape) / 2**20:.1f} MiB train)'
  )


if __name__ == '__main__':
  main()
