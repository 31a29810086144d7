"""Peak memory of resuming a run whose metrics.jsonl is large: the file is read one line at a time
(trainer/writers.py kept_lines), so a resumed run holds one line, not the file.

  python -m benchmarks.bench_resume_metrics --workdir /tmp/mem1g --size-mb 1024
  /usr/bin/time -v python -m benchmarks.bench_resume_metrics --workdir /tmp/mem1g --size-mb 1024

Writes WORKDIR/metrics.jsonl of about SIZE_MB of training records (once; an existing file of that
size is reused), opens it as a run resumed at its last step does (JsonLinesWriter), closes it, and
prints the file's size, the seconds and the peak resident memory (getrusage) in one table row.
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import json
import os
import resource
import time

from benchmarks import common
from runrecord import record
from trainer import writers

LINE = {
  'kind': 'train',
  'step': 0,
  'epoch': 1,
  'train_loss': 2.302585092994046,
  'train_accuracy': 0.1015625,
  'learning_rate': 0.0009999999999999998,
  'images_per_sec': 12345.678,
}


def write_metrics(path, size_bytes):
  """A metrics.jsonl of about size_bytes of train records; returns its last step."""
  step, size = 0, 0
  with open(path, 'w', encoding='utf-8') as f:
    while size < size_bytes:
      step += 1
      text = json.dumps({**LINE, 'step': step}) + '\n'
      f.write(text)
      size += len(text)
  return step


def main(argv=None):
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_resume_metrics', description=common.description(__doc__)
  )
  p.add_argument(
    '--workdir',
    required=True,
    help='folder for the metrics.jsonl (kept: a file of that size is reused)',
  )
  p.add_argument('--size-mb', type=float, default=1024.0, help="the file's size, MB (default 1024)")
  args = p.parse_args(argv)
  os.makedirs(args.workdir, exist_ok=True)
  path = os.path.join(args.workdir, record.METRICS)
  size = int(args.size_mb * 2**20)
  if os.path.exists(path) and os.path.getsize(path) >= size:
    with open(path, 'rb') as f:
      f.seek(-400, os.SEEK_END)
      last = json.loads(f.read().splitlines()[-1])['step']
  else:
    last = write_metrics(path, size)
  start = time.perf_counter()
  writers.JsonLinesWriter(args.workdir, resume_step=last).close()
  seconds = time.perf_counter() - start
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print('| metrics.jsonl (MB) | resumed at step | seconds | peak RSS (MB) |')
  print('|---|---|---|---|')
  print(f'| {os.path.getsize(path) / 2**20:.0f} | {last:,} | {seconds:.1f} | {peak:.0f} |')


if __name__ == '__main__':
  main()
