"""Stop and resume: from a SIGTERM (a preemption notice) to the saved checkpoint, idle and under
CPU load, steps in flight bounded (trainer/process.py STEPS_IN_FLIGHT) and not; and
(--resume-metrics) the peak memory of resuming a run whose metrics.jsonl is large.

  python -m benchmarks.bench_stop_latency --configs configs/digits.py:study --trials 3 --load 0
  python -m benchmarks.bench_stop_latency --resume-metrics /tmp/mem1g --size-mb 1024

Reference: docs/performance.md "The benchmark scripts".
"""

import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import logging

from benchmarks import common
from configs import common as config_common
from configs import validation
from runrecord import files, record
from trainer import metrics, process

# JAX and the trainer load where a mode runs: --help and a bad flag are answered without them.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The study's step time, and a slower one standing for a CelebA step on an accelerator (about
# 0.3 s on this 2-core CPU, as a batch-2048 224-pixel step on an H100: 2048 / 6676 images/s).
CONFIGS = ['configs/digits.py:study', 'configs/digits.py:study,model.width=0.5,data.image_size=16']
START_STEP = 3  # the signal's clock starts once the device has finished this step


def trial(config, per_epoch, limit, rng):
  """One signalled run (train.watch recording each step's output, STEPS_IN_FLIGHT = limit)."""
  from trainer import train

  outputs, original, sent = [], train.watch, []

  def watch(ctx, state):
    fn, bad = original(ctx, state)

    def recording(bad, state):
      outputs.append(out := fn(bad, state))
      return out

    return recording, bad

  def finished(step):  # when the device finished `step` (its watch output is ready)
    while len(outputs) < step:  # appended by the loop's thread: atomic under the GIL
      time.sleep(0.002)
    outputs[step - 1].block_until_ready()
    return time.time()

  def send():  # after step START_STEP, time two, wait a uniform fraction of an epoch, SIGTERM
    first = finished(START_STEP)
    time.sleep(rng.uniform(0, per_epoch) * (finished(START_STEP + 2) - first) / 2)
    now, done = time.time(), sum(o.is_ready() for o in list(outputs))
    sent.append((now, done, done - START_STEP, now - first))  # steps timed, their seconds
    os.kill(os.getpid(), signal.SIGTERM)

  shipped, train.watch, process.STEPS_IN_FLIGHT = process.STEPS_IN_FLIGHT, watch, limit
  try:
    with tempfile.TemporaryDirectory() as workdir:
      threading.Thread(target=send, daemon=True).start()
      try:
        train.train_and_evaluate(config, workdir)
        raise RuntimeError('the run ended before the signal: raise num_epochs')
      except process.Stopped as e:
        saved_at, step = time.time(), e.step
      history = record.read_results(workdir)['history']
  finally:
    train.watch, process.STEPS_IN_FLIGHT = original, shipped
  signalled, done, steps, seconds = sent[0]
  return {
    'seconds': saved_at - signalled,
    'steps_after': step - done,
    'evaluated_after': any(h['step'] > done and 'test_accuracy' in h for h in history),
    'images_per_s': steps * config.batch_size / seconds if seconds > 0 else None,
  }


def throughput(config, rounds):
  """{in flight: median over rounds of each whole run's median logged images/s}."""
  from trainer import train

  shipped, rates = process.STEPS_IN_FLIGHT, {}
  try:
    for _ in range(rounds):
      for limit in (1, 2, 4, None):
        process.STEPS_IN_FLIGHT = limit
        with tempfile.TemporaryDirectory() as workdir:
          train.train_and_evaluate(config, workdir)
          with open(os.path.join(workdir, record.METRICS), encoding='utf-8') as f:
            logged = [json.loads(line) for line in f]
        per_log = [r['images_per_sec'] for r in logged if r['kind'] == 'train'][1:]  # 1st: compile
        rates.setdefault(limit, []).append(statistics.median(per_log))
  finally:
    process.STEPS_IN_FLIGHT = shipped
  return {limit: statistics.median(v) for limit, v in rates.items()}


def resolved(spec, epochs=100):
  """`spec` resolved with num_epochs=`epochs` (100: no run ends before its signal); bad: exit 2."""
  path, _, rest = spec.partition(':')
  try:
    return validation.resolve(
      config_common.load(f'{path}:{rest + "," if rest else ""}num_epochs={epochs}')
    )
  except ValueError as e:
    common.fail(f'--configs {spec}: {e}')


# --resume-metrics: a metrics.jsonl of about --size-mb of training records, written once (a file of
# that size this project wrote is reused), opened as a run resumed at its last step opens it:
# read one line at a time (trainer/metrics.py kept_lines), so memory holds one line, not the file.
METRICS = record.METRICS
LINE = dict(kind='train', step=0, epoch=1, train_loss=2.302585092994046, train_accuracy=0.1015625)
LINE.update(learning_rate=0.0009999999999999998, images_per_sec=12345.678)  # as the loop writes


def resume_metrics(workdir, size_mb):
  """One table row: the file's size, its last step, the seconds and peak RSS of the resume."""
  path, size, last = os.path.join(workdir, METRICS), int(size_mb * 2**20), 0
  home = os.path.realpath(workdir)
  if files.is_ours(home, METRICS, files.read_manifest(home)) and os.path.getsize(path) >= size:
    with open(path, 'rb') as f:
      f.seek(-400, os.SEEK_END)
      last = json.loads(f.read().splitlines()[-1])['step']
  else:

    def write(staging):
      nonlocal last
      written, staged = 0, os.path.join(staging, METRICS)
      with open(staged, 'w', encoding='utf-8') as f:
        while written < size:
          last += 1
          written += f.write(json.dumps({**LINE, 'step': last}) + '\n')
      return [staged]

    try:  # through runrecord/files.py: a metrics.jsonl this project did not write is refused
      with files.Destination(workdir, command='bench_stop_latency', may_write=[METRICS]) as d:
        d.write(write)
    except ValueError as e:
      common.fail(str(e))
  start = time.perf_counter()
  metrics.JsonLinesWriter(workdir, resume_step=last).close()
  seconds = time.perf_counter() - start
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  row = [f'{os.path.getsize(path) / 2**20:.0f}', f'{last:,}', f'{seconds:.1f}', f'{peak:.0f}']
  print(common.table(['metrics.jsonl (MB)', 'resumed at step', 'seconds', 'peak RSS (MB)'], [row]))


STOP, RESUME = 'the stop latency (no --resume-metrics)', '--resume-metrics'
MODE_FLAGS = (  # (mode, flag, type, default, help)
  (STOP, '--trials', int, 5, 'signals per row'),
  (STOP, '--load', str, '0,2', 'busy-looping processes beside the run, comma-separated'),
  (STOP, '--in-flight', str, 'shipped,none', "'shipped' (STEPS_IN_FLIGHT), a number or 'none'"),
  (STOP, '--seed', int, 0, 'seed of the signal times'),
  (STOP, '--throughput-rounds', int, 3, 'rounds of the throughput comparison (0: none)'),
  (STOP, '--throughput-epochs', int, 12, 'epochs of each throughput run'),
  (RESUME, '--size-mb', float, 1024.0, "metrics.jsonl's size, MB"),
)


def main(argv=None):
  p = common.parser('bench_stop_latency', __doc__)
  p.add_argument('--resume-metrics', metavar='WORKDIR', help='resume a run of this folder')
  owners = common.mode_flags(p, MODE_FLAGS)
  common.mode_flag(p, owners, STOP, '--configs', nargs='+', default=CONFIGS, help='config specs')
  args = p.parse_args(argv)
  common.refuse_other_modes(p, args, owners, RESUME if args.resume_metrics else STOP)
  if args.resume_metrics:
    if not args.size_mb > 0:
      common.fail(f'--size-mb={args.size_mb}: give a positive size')
    return resume_metrics(args.resume_metrics, args.size_mb)
  try:
    args.load = [int(n) for n in args.load.split(',')]
    args.in_flight = [v.strip() for v in args.in_flight.split(',')]
    if any(v not in ('shipped', 'none') and not int(v) > 0 for v in args.in_flight):
      raise ValueError(args.in_flight)
  except ValueError:
    common.fail("--load: give whole numbers; --in-flight: 'shipped', 'none' or positive numbers")
  if args.trials < 1 or args.throughput_epochs < 1:
    common.fail('--trials and --throughput-epochs must be positive')
  if min(args.load) < 0 or args.throughput_rounds < 0:
    common.fail('--load and --throughput-rounds must not be negative')
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # before JAX loads
  import jax

  from input_pipeline import batching
  from numerics import setup as numerics_setup
  from trainer import run

  process.quiet_libraries()
  logging.set_verbosity(logging.ERROR)  # the loop's own lines (stop, save) per trial
  configs = [resolved(spec) for spec in args.configs]
  for config in configs:
    numerics_setup.configure(config)  # one process: every config must need the same XLA flags
  jax.config.update('jax_compilation_cache_dir', os.path.join(REPO, '.jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  common.command_line('bench_stop_latency', argv)
  shipped = process.STEPS_IN_FLIGHT
  flights = [shipped if v == 'shipped' else None if v == 'none' else int(v) for v in args.in_flight]
  header = ['config', 'step (s)', 'CPU hogs', 'trials']
  rest = ['seconds to the saved checkpoint, median / max', 'evaluations after the signal']
  for n in flights:
    steps = f'{"none" if n is None else n} in flight: steps after the signal, median / max'
    header += [steps, *rest, 'images/s before it']
  print(common.table(header, []))
  rng = random.Random(args.seed)
  for spec, config in zip(args.configs, configs, strict=True):
    numerics_setup.configure(config)  # its matmul precision
    per_epoch = batching.steps_per_epoch(len(run.load_dataset(config).train), config.batch_size)
    for load in args.load:
      hogs = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(load)]
      try:
        results = [[trial(config, per_epoch, f, rng) for _ in range(args.trials)] for f in flights]
      finally:
        for hog in hogs:
          hog.kill()
          hog.wait()
      rates = [r['images_per_s'] for r in results[0] if r['images_per_s']]
      step_s = config.batch_size / statistics.median(rates) if rates else float('nan')
      cells = []  # per setting: steps median / max | seconds median / max | evaluations | images/s
      for setting in results:
        seconds = [r['seconds'] for r in setting]
        steps = [r['steps_after'] for r in setting]
        rates = [r['images_per_s'] for r in setting if r['images_per_s']]
        cells.append(
          f'{statistics.median(steps):g} / {max(steps)} | {statistics.median(seconds):.2f} / '
          f'{max(seconds):.2f} | {sum(r["evaluated_after"] for r in setting)} | '
          f'{common.fmt(statistics.median(rates) if rates else None, ".0f")}'
        )
      print(f'| {spec} | {step_s:.3f} | {load} | {args.trials} | {" | ".join(cells)} |', flush=True)
  print(f'bound: steps after the signal <= STEPS_IN_FLIGHT + 1 = {shipped + 1}')
  if args.throughput_rounds:
    config = resolved(args.configs[0], args.throughput_epochs)
    numerics_setup.configure(config)
    rates = throughput(config, args.throughput_rounds)
    named = ', '.join(f'{"none" if k is None else k} in flight {v:.0f}' for k, v in rates.items())
    print(
      f'throughput ({args.configs[0]}, {args.throughput_epochs} epochs, median images/s of '
      f'{args.throughput_rounds} alternating rounds): {named}'
    )


if __name__ == '__main__':
  sys.exit(main())
