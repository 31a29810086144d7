"""Stop latency: from a SIGTERM (a preemption notice) to the saved checkpoint, idle and under CPU
load, with the host's steps in flight bounded (trainer/stop.py STEPS_IN_FLIGHT) and unbounded.

  python -m benchmarks.bench_stop_latency                        # digits study + a slower config
  python -m benchmarks.bench_stop_latency --configs configs/digits.py:study --trials 3 --load 0

Each trial trains the config (`num_epochs` raised so that no run ends first) through the training
loop itself (trainer/loop.py train_and_evaluate, in this process, a fresh workdir), and a thread
sends SIGTERM to this process at a random moment: once the device has finished step 3 (the compile
is over), after a delay drawn uniformly from [0, one epoch of steps) at the step time just
measured. The loop stops at its next step boundary with a checkpoint (stop.Stopped). Measured per
trial: the seconds from the signal to the Stopped exception (the checkpoint written and waited
for), the steps after the signal (the stop's step minus the steps the device had finished when
the signal was sent: each step's non-finite-watch output is ready when the step is done), whether
an evaluation ran after the signal, and the device's images/s before the signal.

`--load N` runs N busy-looping processes beside it (a CPU hog: a loaded host). The `in flight`
column: STEPS_IN_FLIGHT as shipped, or `none` (no bound: JAX's own asynchronous dispatch, how the
loop ran before the bound); the step time is the first setting's, from its images/s. The bound the
table checks (docs/operations.md): steps after the signal <= STEPS_IN_FLIGHT + 1; seconds <=
(STEPS_IN_FLIGHT + 1) x step time + one evaluation (only when the signal comes in the last steps of
an evaluated epoch) + the checkpoint write. Prints one Markdown row per (config, load), each
in-flight setting's median and largest over its trials.


`--throughput-rounds R` (default 3; 0 skips it) then prints what the bound costs: the first
config trained whole for `--throughput-epochs` epochs at 1, 2 and 4 steps in flight and
unbounded, the settings alternating, R rounds; per setting the median over rounds of each run's
median logged images/s (trainer/clock.py: compiles, evaluations and saves left out).
"""

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import common

# JAX, the trainer and the configs are imported inside the functions that use them: --help and a
# bad flag are answered before any of them loads.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The study's step time, and a slower one standing for a CelebA step on an accelerator (about
# 0.3 s on this 2-core CPU, as a batch-2048 224-pixel step on an H100: 2048 / 6676 images/s).
CONFIGS = ('configs/digits.py:study', 'configs/digits.py:study,model.width=0.5,data.image_size=16')
START_STEP = 3  # the signal's clock starts once the device has finished this step
HOG = 'while True: pass'


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_stop_latency',
    description='Stop latency: from a SIGTERM (a preemption notice) to '
    'the saved checkpoint, idle and under CPU load, steps in flight '
    'bounded and unbounded.',
  )
  p.add_argument(
    '--configs',
    nargs='+',
    default=list(CONFIGS),
    help='config specs (file:presets,key=value); default: the digits study and a '
    'slower digits config',
  )
  p.add_argument('--trials', type=int, default=5, help='signals per row (default 5)')
  p.add_argument(
    '--load',
    default='0,2',
    help='comma-separated numbers of busy-looping processes beside the run '
    '(default 0,2: idle, and a hog per core of a 2-core host)',
  )
  p.add_argument(
    '--in-flight',
    default='shipped,none',
    help="comma-separated: 'shipped' (trainer/stop.py STEPS_IN_FLIGHT), a number, or "
    "'none' (unbounded); default shipped,none",
  )
  p.add_argument('--seed', type=int, default=0, help='seed of the signal times')
  p.add_argument(
    '--throughput-rounds',
    type=int,
    default=3,
    help='rounds of the throughput comparison (0: none; default 3)',
  )
  p.add_argument(
    '--throughput-epochs', type=int, default=12, help='epochs of each throughput run (default 12)'
  )
  args = p.parse_args(argv)
  try:
    args.load = [int(n) for n in args.load.split(',')]
    args.in_flight = [v.strip() for v in args.in_flight.split(',')]
    for v in args.in_flight:
      if v not in ('shipped', 'none') and not (v.isdigit() and int(v) > 0):
        raise ValueError(v)
  except ValueError:
    common.fail(
      "--load: give whole numbers; --in-flight: 'shipped', 'none' or positive whole "
      'numbers, comma-separated'
    )
  if (
    args.trials < 1
    or min(args.load) < 0
    or args.throughput_rounds < 0
    or args.throughput_epochs < 1
  ):
    common.fail(
      '--trials and --throughput-epochs must be positive, --load and '
      '--throughput-rounds not negative'
    )
  return args


def in_flight_limit(value, shipped):
  return shipped if value == 'shipped' else None if value == 'none' else int(value)


def start_hogs(n):
  return [subprocess.Popen([sys.executable, '-c', HOG]) for _ in range(n)]


def stop_hogs(hogs):
  for proc in hogs:
    proc.kill()
    proc.wait()


class Markers:
  """Each step's non-finite-watch output and when the device finished it (a waiting thread)."""

  def __init__(self):
    self.outputs, self.finished, self.lock = [], [], threading.Lock()

  def add(self, output):
    with self.lock:
      self.outputs.append(output)

  def done(self):
    """Steps the device has finished now (each output is ready when its step is done)."""
    with self.lock:
      outputs = list(self.outputs)
    return sum(o.is_ready() for o in outputs)

  def wait_for(self, step):
    """Block until the device has finished `step` (1-based); returns the time then."""
    while True:
      with self.lock:
        output = self.outputs[step - 1] if len(self.outputs) >= step else None
      if output is not None:
        output.block_until_ready()
        return time.time()
      time.sleep(0.002)


def watched(markers):
  """run.watch with its outputs recorded in `markers` (patched into the loop for a trial)."""
  from trainer import run

  original = run.watch

  def watch(ctx, state):
    fn, bad = original(ctx, state)

    def recording(bad, state):
      out = fn(bad, state)
      markers.add(out)
      return out

    return recording, bad

  return original, watch


def signal_later(markers, per_epoch, rng, sent):
  """A thread: once step START_STEP is done, estimate the step time over the next two steps,
  wait a uniform fraction of an epoch, send SIGTERM; `sent` gets (time, steps done, images/s
  window as (steps, seconds))."""

  def send():
    first = markers.wait_for(START_STEP)
    step_s = (markers.wait_for(START_STEP + 2) - first) / 2
    time.sleep(rng.uniform(0, per_epoch) * step_s)
    now, done = time.time(), markers.done()
    sent.append((now, done, done - START_STEP, now - first))
    os.kill(os.getpid(), signal.SIGTERM)

  thread = threading.Thread(target=send, daemon=True)
  thread.start()
  return thread


def trial(config, per_epoch, limit, rng):
  """One signalled run: {'seconds', 'steps_after', 'evaluated_after', 'images_per_s'}."""
  from runrecord import record
  from trainer import loop, run, stop

  markers = Markers()
  original, patched = watched(markers)
  shipped, run.watch, stop.STEPS_IN_FLIGHT = stop.STEPS_IN_FLIGHT, patched, limit
  sent = []
  try:
    with tempfile.TemporaryDirectory() as workdir:
      signal_later(markers, per_epoch, rng, sent)
      try:
        loop.train_and_evaluate(config, workdir)
        raise RuntimeError('the run ended before the signal: raise num_epochs')
      except stop.Stopped as e:
        saved_at, step = time.time(), e.step
      history = record.read_results(workdir)['history']
  finally:
    run.watch, stop.STEPS_IN_FLIGHT = original, shipped
  signalled, done, steps, seconds = sent[0]
  return {
    'seconds': saved_at - signalled,
    'steps_after': step - done,
    'evaluated_after': any(h['step'] > done and 'test_accuracy' in h for h in history),
    'images_per_s': steps * config.batch_size / seconds if seconds > 0 else None,
  }


def throughput(config, rounds):
  """{in flight: median over rounds of each whole run's median logged images/s}."""
  import json

  from runrecord import record
  from trainer import loop, stop

  shipped, rates = stop.STEPS_IN_FLIGHT, {}
  try:
    for _ in range(rounds):
      for limit in (1, 2, 4, None):
        stop.STEPS_IN_FLIGHT = limit
        with tempfile.TemporaryDirectory() as workdir:
          loop.train_and_evaluate(config, workdir)
          with open(os.path.join(workdir, record.METRICS), encoding='utf-8') as f:
            logged = [json.loads(line) for line in f]
        per_log = [r['images_per_sec'] for r in logged if r['kind'] == 'train'][1:]  # 1st: compile
        rates.setdefault(limit, []).append(statistics.median(per_log))
  finally:
    stop.STEPS_IN_FLIGHT = shipped
  return {limit: statistics.median(v) for limit, v in rates.items()}


def resolved(spec, epochs=100):
  """The resolved config of `spec` with num_epochs=`epochs` (100: no run ends before its
  signal); one line on a bad spec."""
  from configs import loader, validation

  path, _, rest = spec.partition(':')
  try:
    return validation.resolve(
      loader.load(f'{path}:{rest + "," if rest else ""}num_epochs={epochs}', [])
    )
  except ValueError as e:
    common.fail(f'--configs {spec}: {str(e).splitlines()[0]}')


def cell(results):
  """'steps median/max; seconds median/max; evaluations; images/s' of one setting's trials."""
  seconds = [r['seconds'] for r in results]
  steps = [r['steps_after'] for r in results]
  rates = [r['images_per_s'] for r in results if r['images_per_s']]
  return (
    f'{statistics.median(steps):g} / {max(steps)} | {statistics.median(seconds):.2f} / '
    f'{max(seconds):.2f} | {sum(r["evaluated_after"] for r in results)} | '
    f'{common.fmt(statistics.median(rates) if rates else None, ".0f")}'
  )


def header(flights):
  """The table's two header lines: per in-flight setting, its four columns."""
  columns = ['config', 'step (s)', 'CPU hogs', 'trials']
  for flight in flights:
    name = f'{flight} in flight'
    columns += [
      f'{name}: steps after the signal, median / max',
      'seconds to the saved checkpoint, median / max',
      'evaluations after the signal',
      'images/s before it',
    ]
  return '| ' + ' | '.join(columns) + ' |\n' + '|---' * len(columns) + '|'


def main(argv=None):
  args = parse_args(argv)
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  from numerics import setup as numerics_setup
  from trainer import quiet, stop

  quiet.install()
  from absl import logging

  logging.set_verbosity(logging.ERROR)  # the loop's own lines (stop, save) per trial
  configs = [resolved(spec) for spec in args.configs]
  for config in configs:
    numerics_setup.configure(config)  # one process: every config must need the same XLA flags
  import jax

  from input_pipeline import batching
  from trainer import run

  jax.config.update('jax_compilation_cache_dir', os.path.join(REPO, '.jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
  print(common.environment())
  print(common.command_line('bench_stop_latency', argv))
  flights = [in_flight_limit(v, stop.STEPS_IN_FLIGHT) for v in args.in_flight]
  print(header(['none' if f is None else f for f in flights]))
  rng = random.Random(args.seed)
  for spec, config in zip(args.configs, configs, strict=True):
    numerics_setup.configure(config)  # its matmul precision
    per_epoch = batching.steps_per_epoch(len(run.load_dataset(config).train), config.batch_size)
    for load in args.load:
      hogs = start_hogs(load)
      try:
        results = [
          [trial(config, per_epoch, limit, rng) for _ in range(args.trials)] for limit in flights
        ]
      finally:
        stop_hogs(hogs)
      rates = [r['images_per_s'] for r in results[0] if r['images_per_s']]
      step_s = config.batch_size / statistics.median(rates) if rates else float('nan')
      print(
        f'| {spec} | {step_s:.3f} | {load} | {args.trials} | '
        + ' | '.join(cell(r) for r in results)
        + ' |',
        flush=True,
      )
  print(f'bound: steps after the signal <= STEPS_IN_FLIGHT + 1 = {stop.STEPS_IN_FLIGHT + 1}')
  if args.throughput_rounds:
    config = resolved(args.configs[0], args.throughput_epochs)
    numerics_setup.configure(config)
    rates = throughput(config, args.throughput_rounds)
    print(
      f'throughput ({args.configs[0]}, {args.throughput_epochs} epochs, median images/s of '
      f'{args.throughput_rounds} alternating rounds): '
      + ', '.join(f'{"none" if k is None else k} in flight {v:.0f}' for k, v in rates.items())
    )
  return 0


if __name__ == '__main__':
  sys.exit(main())
