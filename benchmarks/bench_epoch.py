"""Per-epoch overhead: one evaluation and one checkpoint save against an epoch of training steps.

  python -m benchmarks.bench_epoch --config configs/celeba.py:gpu --image-size 224 \
      --compute-dtype bfloat16                       # GPU: CelebA's epoch, batch 2048 (79 steps)
  python -m benchmarks.bench_epoch --image-size 32 --width 0.25 --batch 64 \
      --train-examples 1280 --test-examples 512      # CPU: 20 steps per epoch

Everything goes through the run context as the training loop does (trainer/run.py): the train step
of bench_step (`JaxStep`: the phase where every parameter trains, one resident batch), the
evaluation `run.evaluate` with the eval step (host gather on a prefetch thread, padded and masked
last batch), and the checkpoint the loop writes at every epoch end: `loop.save_state` (the state's
digest, then the loop's own write) into a temporary folder with the loop's Orbax manager
(asynchronous).
Measured, each the median of its repeats after one untimed call (the first evaluation compiles):

  - the training step (bench_step's timing: `--windows` windows of `--steps` steps);
  - one evaluation of `--test-examples` examples at the config's eval_batch_size;
  - the save's synchronous part (what the loop waits for: the digest, Orbax's copy of the state to
    the host, the write started), its total (until Orbax reports the write finished), and the
    training step while a write runs in the background (the steps right after a save).

The data: both splits repeat one random uint8 image (a view: no memory per example), so the host
gathers as many bytes per batch as from the decoded cache, from memory the CPU caches hold. The
epoch is steps_per_epoch(--train-examples, batch_size) steps; the defaults are CelebA's split as the
study uses it (162,038 training and 40,561 test images: at batch 2048, 79 steps).

Prints a Markdown table with each item's share of the epoch's training time (steps x median
step); the last line is `epoch_overhead_fraction=<float>`: (evaluation + synchronous save) over
that time, the wall time an epoch spends outside training when it evaluates and saves every epoch.
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import statistics
import tempfile
import time

from benchmarks import common, step_args

CELEBA_TRAIN, CELEBA_TEST = 162_038, 40_561  # the per-identity split (README, CelebA)


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_epoch', description=common.description(__doc__)
  )
  step_args.add_args(parser)
  parser.add_argument(
    '--train-examples',
    type=int,
    default=CELEBA_TRAIN,
    help='training examples of the epoch (default: CelebA, per-identity split)',
  )
  parser.add_argument(
    '--test-examples',
    type=int,
    default=CELEBA_TEST,
    help='examples of one evaluation (default: CelebA, per-identity split)',
  )
  parser.add_argument('--repeats', type=int, default=3, help='timed evaluations and saves')
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  step_args.parse_flags(make_parser(), None)

import jax
import numpy as np

from benchmarks import bench_step
from input_pipeline import base, batching
from trainer import checkpointing, loop, run


def repeated_image_dataset(config, train_examples, test_examples, num_classes):
  """Both splits as one random image repeated (a stride-0 view), random labels."""
  rng = np.random.default_rng(0)
  size = config.data.image_size
  image = rng.integers(0, 256, (1, size, size, 3), dtype=np.uint8)

  def split(n):
    images = np.lib.stride_tricks.as_strided(
      image, (n, size, size, 3), (0,) + image.strides[1:], writeable=False
    )
    return base.Split(images, rng.integers(0, num_classes, n, dtype=np.int32))

  return base.Dataset('repeated', split(train_examples), split(test_examples), num_classes)


def time_calls(fn, repeats):
  """[seconds of each of `repeats` calls of fn()] after one untimed call."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def save(bench, mngr):
  """The loop's epoch-end checkpoint of the current state (trainer/loop.py `save_state`: the
  digest, then `save`, which first waits for the previous write); returns when it does: the
  synchronous part."""
  step = int(jax.device_get(bench.state['step']))
  loop.save_state(mngr, step, bench.state, {'status': 'running', 'step': step})


def time_saves(bench, mngr, repeats, steps_during):
  """{'sync': [s], 'total': [s], 'step_while_writing': [s per step]} of `repeats` saves after an
  untimed one: each waited for at once, then another with `steps_during` steps timed while it
  writes."""
  out = {'sync': [], 'total': [], 'step_while_writing': []}
  save(bench, mngr)
  for _ in range(repeats):
    bench.run(1)  # a new step to save
    checkpointing.wait(mngr)
    start = time.perf_counter()
    save(bench, mngr)
    out['sync'].append(time.perf_counter() - start)
    checkpointing.wait(mngr)
    out['total'].append(time.perf_counter() - start)
    bench.run(1)
    save(bench, mngr)
    out['step_while_writing'].append(bench.run(steps_during) / steps_during)
  checkpointing.wait(mngr)
  return out


def measure(args, config):
  dataset = repeated_image_dataset(
    config, args.train_examples, args.test_examples, args.num_classes
  )
  bench = bench_step.build_step(config, bench_step.selected_devices(args), dataset)
  step_times = common.alternate({'step': bench.run}, args.warmup, args.windows, args.steps)['step']
  eval_fn = run.eval_step(bench.ctx, bench.state)
  evals = time_calls(lambda: run.evaluate(bench.ctx, eval_fn, bench.state), args.repeats)
  with tempfile.TemporaryDirectory(prefix='bench_epoch_') as workdir:
    mngr = checkpointing.manager(workdir, keep=2)
    try:
      saves = time_saves(bench, mngr, args.repeats, min(args.steps, bench.ctx.per_epoch))
    finally:
      checkpointing.close(mngr)
  return bench, {'step': step_times, 'eval': evals, **saves}


def state_mib(state):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / 2**20


def table(bench, times, args):
  """(Markdown table, overhead fraction)."""
  c, ctx = bench.config, bench.ctx
  med = {name: statistics.median(t) for name, t in times.items()}
  epoch_s = ctx.per_epoch * med['step']
  eval_batches = batching.num_eval_batches(len(ctx.dataset.test), c.eval_batch_size)

  def share(seconds):
    return f'{seconds / epoch_s:.1%}'

  def rng(name, scale, unit):  # median (min-max) of `name`'s times, in `unit`
    digits = 2 if scale > 1 else 3
    return (
      f'{med[name] * scale:.{digits}f} {unit} '
      f'({min(times[name]) * scale:.{digits}f}-{max(times[name]) * scale:.{digits}f})'
    )

  overhead = (med['eval'] + med['sync']) / epoch_s
  rows = [
    ('training step', rng('step', 1e3, 'ms'), f'x {ctx.per_epoch} = {epoch_s:.2f} s', '100%'),
    (
      f'evaluation ({len(ctx.dataset.test):,} examples, {eval_batches} batch(es) of '
      f'{c.eval_batch_size})',
      rng('eval', 1, 's'),
      'x 1',
      share(med['eval']),
    ),
    (
      f'checkpoint save, synchronous part ({state_mib(bench.state):.0f} MiB state)',
      rng('sync', 1, 's'),
      'x 1',
      share(med['sync']),
    ),
    (
      'checkpoint save, total (until written; the rest runs in the background)',
      rng('total', 1, 's'),
      '',
      share(med['total']),
    ),
    (
      'training step while the write runs',
      rng('step_while_writing', 1e3, 'ms'),
      '',
      f'{med["step_while_writing"] / med["step"]:.2f}x the step',
    ),
    (
      'overhead per epoch (evaluation + synchronous save)',
      f'{med["eval"] + med["sync"]:.3f} s',
      '',
      f'{overhead:.1%}',
    ),
  ]
  lines = [
    f'ResNet-18 width {c.model.width:g}, {c.model.stem} stem, {c.data.image_size}^2, '
    f'global batch {c.batch_size} on {len(bench.devices)} device(s), compute '
    f'{c.numerics.compute_dtype}; epoch = {ctx.per_epoch} steps ({len(ctx.dataset.train):,} '
    f'examples); medians (min-max) of {args.windows} step windows x {args.steps} steps and '
    f'{args.repeats} evaluations and saves',
    "| item | time | per epoch | share of the epoch's training time |",
    '|---|---|---|---|',
  ]
  lines += [f'| {a} | {b} | {d} | {e} |' for a, b, d, e in rows]
  return '\n'.join(lines), overhead


def main(argv=None):
  args, config = step_args.parse(make_parser(), argv)
  if args.test_examples < 1 or args.repeats < 1:
    common.fail('--test-examples and --repeats must be positive')
  if args.train_examples < config.batch_size:
    common.fail(
      f'--train-examples={args.train_examples}: need at least one batch of {config.batch_size}'
    )
  print(common.environment())
  print(common.command_line('bench_epoch', argv))
  bench, times = measure(args, config)
  text, overhead = table(bench, times, args)
  print(text)
  print(f'epoch_overhead_fraction={overhead:.4f}')


if __name__ == '__main__':
  main()
