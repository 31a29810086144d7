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

`--variants` adds two more compilations of the same lowering (GPU questions; XLA's deterministic
flags also switch autotuning off, its autotuner taking the first candidate):
  exclude_nondeterministic  `xla_gpu_exclude_nondeterministic_ops` instead (deterministic kernels,
                            refusing select-and-scatter: the step has none)
  deterministic_autotuned   deterministic ops with the autotuning results of the nondeterministic
                            compilation (`xla_gpu_dump_autotune_results_to` there, then
                            `xla_gpu_load_autotune_results_from`): does XLA keep the tuned kernels,
                            and do they repeat bit for bit? Needs `nondeterministic` in the list;
                            where that compilation writes no results (XLA:CPU has no autotuner) the
                            variant is left out with a note.

Prints a Markdown table, then `<variant>_vs_nondeterministic=<float>` for each extra variant; the
last line is `deterministic_vs_nondeterministic=<float>`: images/s of the deterministic variant
over the other's (goal on a GPU: >= 0.97). XLA:CPU is deterministic either way, so on CPU the
variants compile the same program and the ratios only show the noise.
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import collections
import os
import re
import statistics
import tempfile
import time

from benchmarks import common, step_args

OPTION = 'xla_gpu_deterministic_ops'
VARIANTS = {'deterministic': {OPTION: True}, 'nondeterministic': {OPTION: False}}
EXCLUDE = 'xla_gpu_exclude_nondeterministic_ops'
DUMP_AUTOTUNE, LOAD_AUTOTUNE = (
  'xla_gpu_dump_autotune_results_to',
  'xla_gpu_load_autotune_results_from',
)
EXTRA_VARIANTS = {
  'exclude_nondeterministic': {OPTION: False, EXCLUDE: True},
  'deterministic_autotuned': {OPTION: True},
}  # + LOAD_AUTOTUNE (compile_options)
ALL_VARIANTS = (*VARIANTS, *EXTRA_VARIANTS)


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_determinism', description=common.description(__doc__)
  )
  step_args.add_args(parser)
  parser.add_argument(
    '--repeat-steps', type=int, default=3, help='steps run twice from one state, per variant'
  )
  parser.add_argument(
    '--variants',
    default=','.join(VARIANTS),
    help='compilations compared: ' + ','.join(ALL_VARIANTS),
  )
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  step_args.parse_flags(make_parser(), None)

import jax

from benchmarks import bench_step
from trainer import checkpointing

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


def parse_variants(text):
  """The --variants list, in compile order (nondeterministic first: its autotuning results are
  what deterministic_autotuned loads); a bad list ends the process with one line (exit 2)."""
  names = [n.strip() for n in text.split(',') if n.strip()]
  unknown = [n for n in names if n not in ALL_VARIANTS]
  if unknown or not names or len(set(names)) < len(names):
    common.fail(f'--variants={text}: give distinct names among {",".join(ALL_VARIANTS)}')
  if 'deterministic_autotuned' in names and 'nondeterministic' not in names:
    common.fail(
      '--variants: deterministic_autotuned loads the autotuning results of the '
      'nondeterministic compilation; list nondeterministic too'
    )
  return sorted(names, key=lambda n: n != 'nondeterministic')


def compile_options(name, autotune_file):
  """(XLA options of the variant's compilation, or None when it cannot be built here; a note)."""
  options = {**VARIANTS, **EXTRA_VARIANTS}[name]
  if name == 'nondeterministic':
    return {**options, DUMP_AUTOTUNE: autotune_file}, ''
  if name != 'deterministic_autotuned':
    return options, ''
  if not os.path.getsize(autotune_file):
    return None, (
      'deterministic_autotuned left out: the nondeterministic compilation wrote no '
      'autotuning results (XLA:CPU has no autotuner)'
    )
  return {**options, LOAD_AUTOTUNE: autotune_file}, ''


def compile_variants(bench, names):
  """({variant: {'compiled', 'compile_s', 'ops'}}, [notes]) from the bench's one lowering."""
  out, notes = {}, []
  with tempfile.TemporaryDirectory(prefix='bench_determinism_') as folder:
    autotune_file = os.path.join(folder, 'autotune_results.textproto')
    open(autotune_file, 'w').close()  # empty: nothing written yet
    for name in names:
      options, note = compile_options(name, autotune_file)
      if options is None:
        notes.append(note)
        continue
      start = time.perf_counter()
      compiled = bench.lowered.compile(options)
      out[name] = {
        'compiled': compiled,
        'compile_s': time.perf_counter() - start,
        'ops': scatter_and_sort_ops(compiled),
      }
  return out, notes


def measure(args, config, names=tuple(VARIANTS)):
  """(bench, {variant: {'times': [s/step], 'ops': {...}, 'repeats': bool, 'compile_s': s}},
  [notes])."""
  bench = bench_step.build_step(
    config, bench_step.selected_devices(args), num_classes=args.num_classes, compile_step=False
  )  # lowered only
  out, notes = compile_variants(bench, names)
  times = common.alternate(
    {name: lambda n, c=v['compiled']: bench.run(n, c) for name, v in out.items()},
    args.warmup,
    args.windows,
    args.steps,
  )
  for name, v in out.items():
    v['times'] = times[name]
    v['repeats'] = repeats_identically(bench, v['compiled'], args.repeat_steps)
  return bench, out, notes


def table(bench, results, args):
  """(Markdown table, {variant: its images/s over the nondeterministic variant's})."""
  c = bench.config
  ips = {name: c.batch_size / statistics.median(v['times']) for name, v in results.items()}
  lines = [
    f'ResNet-18 width {c.model.width:g}, {c.model.stem} stem, {c.data.image_size}^2, '
    f'global batch {c.batch_size} on {len(bench.devices)} device(s), '
    f'{bench_step.numerics_line(c, bench.conv_impl, bench.devices[0].platform)}; median '
    f'of {args.windows} alternating windows x {args.steps} steps',
    f'| {OPTION} | ms/step (median; min-max) | images/s | scatter/sort ops in the '
    f'compiled step | {args.repeat_steps} steps repeat bit for bit | compile s |',
    '|---|---|---|---|---|---|',
  ]
  for name, v in results.items():
    t = [x * 1e3 for x in v['times']]
    ops = ', '.join(f'{k} {n}' for k, n in sorted(v['ops'].items())) or 'none'
    lines.append(
      f'| {name} | {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) | '
      f'{ips[name]:.1f} | {ops} | {"yes" if v["repeats"] else "no"} | '
      f'{v["compile_s"]:.1f} |'
    )
  base = ips.get('nondeterministic')
  return '\n'.join(lines), {
    name: ips[name] / base for name in ips if base and name != 'nondeterministic'
  }


def main(argv=None):
  args, config = step_args.parse(make_parser(), argv)
  if args.repeat_steps < 1:
    common.fail(f'--repeat-steps={args.repeat_steps}: give a positive number of steps')
  names = parse_variants(args.variants)
  print(common.environment())
  print(common.command_line('bench_determinism', argv))
  bench, results, notes = measure(args, config, names)
  text, ratios = table(bench, results, args)
  print('\n'.join([text, *notes]))
  for name, ratio in ratios.items():  # deterministic's last: the line the tools read
    if name != 'deterministic':
      print(f'{name}_vs_nondeterministic={ratio:.4f}')
  if 'deterministic' in ratios:
    print(f'deterministic_vs_nondeterministic={ratios["deterministic"]:.4f}')


if __name__ == '__main__':
  main()
