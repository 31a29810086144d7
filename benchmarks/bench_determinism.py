"""The training step with and without XLA's deterministic GPU operations, timed alternately.

  python -m benchmarks.bench_determinism --config configs/celeba.py:gpu --image-size 224 \
      --batch 256 --compute-dtype bfloat16                                        # GPU
  python -m benchmarks.bench_determinism --steps 2 --windows 2                    # CPU: 64^2

bench_step's step (the run context on synthetic data, `JaxStep`) compiled twice from one lowering,
with the XLA option `xla_gpu_deterministic_ops` true and false: per compilation, through JAX's
`compiler_options` (the same XLA debug option that `numerics.gpu_deterministic=True` puts in
XLA_FLAGS for a whole run), so both run in one process on one state, in alternating timed windows
(`common.alternate`). For each variant: ms/step and images/s, the scatter, select-and-scatter and
sort operations of its compiled HLO (XLA's deterministic mode sorts a scatter's indices), and
whether `--repeat-steps` steps from one state, run twice, end in bit-identical states (a CRC-32
of every leaf, checkpointing.state_digest).

Prints a Markdown table; the last line is `deterministic_vs_nondeterministic=<float>`: images/s
of the deterministic variant over the other's (goal on a GPU: >= 0.97). XLA:CPU is deterministic
either way, so on CPU the two compile the same program and the ratio only shows the noise.
"""

import argparse
import collections
import os
import re
import statistics
import sys
import time

if __package__ in (None, ''):  # run as a file: make the repository importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from benchmarks import bench_step, common  # noqa: E402
from trainer import checkpointing  # noqa: E402

OPTION = 'xla_gpu_deterministic_ops'
VARIANTS = {'deterministic': {OPTION: True}, 'nondeterministic': {OPTION: False}}
SCATTER_OR_SORT = re.compile(r'\b(scatter|select-and-scatter|sort)\(')


def scatter_and_sort_ops(compiled):
  """{operation: count} of scatter, select-and-scatter and sort in a compiled step's HLO."""
  return dict(collections.Counter(SCATTER_OR_SORT.findall(compiled.as_text())))


def repeats_identically(bench, compiled, steps):
  """Whether `steps` steps of `compiled` from the current state, run twice, give bit-identical
  states (checkpointing.state_digest); the bench's state moves on by `steps`."""
  start = jax.device_get(bench.state)
  digests = []
  for _ in range(2):
    bench.state = jax.device_put(start, bench.ctx.replicated)
    bench.run(steps, compiled)
    digests.append(checkpointing.state_digest(bench.state))
  return digests[0] == digests[1]


def measure(args, config):
  """(bench, {variant: {'times': [s/step], 'ops': {...}, 'repeats': bool, 'compile_s': s}})."""
  bench = bench_step.build_step(config, bench_step.selected_devices(args),
                                num_classes=args.num_classes, compile_step=False)  # lowered only
  out = {}
  for name, options in VARIANTS.items():
    start = time.perf_counter()
    compiled = bench.lowered.compile(options)
    out[name] = {'compiled': compiled, 'compile_s': time.perf_counter() - start,
                 'ops': scatter_and_sort_ops(compiled)}
  times = common.alternate({name: lambda n, c=v['compiled']: bench.run(n, c)
                            for name, v in out.items()}, args.warmup, args.windows, args.steps)
  for name, v in out.items():
    v['times'] = times[name]
    v['repeats'] = repeats_identically(bench, v['compiled'], args.repeat_steps)
  return bench, out


def table(bench, results, args):
  """(Markdown table, images/s ratio deterministic / nondeterministic)."""
  c = bench.config
  ips = {name: c.batch_size / statistics.median(v['times']) for name, v in results.items()}
  lines = [f'ResNet-18 width {c.model.width:g}, {c.model.stem} stem, {c.data.image_size}^2, '
           f'global batch {c.batch_size} on {len(bench.devices)} device(s), '
           f'{bench_step.numerics_line(c, bench.conv_impl, bench.devices[0].platform)}; median '
           f'of {args.windows} alternating windows x {args.steps} steps',
           f'| {OPTION} | ms/step (median; min-max) | images/s | scatter/sort ops in the '
           f'compiled step | {args.repeat_steps} steps repeat bit for bit | compile s |',
           '|---|---|---|---|---|---|']
  for name, v in results.items():
    t = [x * 1e3 for x in v['times']]
    ops = ', '.join(f'{k} {n}' for k, n in sorted(v['ops'].items())) or 'none'
    lines.append(f'| {name} | {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) | '
                 f'{ips[name]:.1f} | {ops} | {"yes" if v["repeats"] else "no"} | '
                 f'{v["compile_s"]:.1f} |')
  return '\n'.join(lines), ips['deterministic'] / ips['nondeterministic']


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  bench_step.add_args(parser)
  parser.add_argument('--repeat-steps', type=int, default=3,
                      help='steps run twice from one state, per variant')
  args, config = bench_step.parse(parser, argv)
  if args.repeat_steps < 1:
    common.fail(f'--repeat-steps={args.repeat_steps}: give a positive number of steps')
  print(common.environment())
  print(common.command_line('bench_determinism', argv))
  bench, results = measure(args, config)
  text, ratio = table(bench, results, args)
  print(text)
  print(f'deterministic_vs_nondeterministic={ratio:.4f}')


if __name__ == '__main__':
  main()
