"""The parts of the GPU agenda (benchmarks/gpu_evidence.py runs them): each part's commands at the
GPU's size and at a toy size for CPU (`smoke`), its expected minutes on an H100, its headline, and
each command's own success criterion (`expect`): the benchmark's result line, pytest's summary,
every run of a sweep completed, the file an export writes. A part is done only when every command
exited as expected and met its criterion; PRIORITY orders the parts by what their figures are worth
(benchmarks/gpu_plan.py plans a slot of device time with it).

Every command is an existing tool's own command line (the benchmarks, pytest, sweeps.sweep), run
from the repository root; the study's records are exported to CSV in this process
(analysis.export) so that the folder brought back holds them without the training states. At the
toy size the sweeps are dry runs (checked and planned, not trained): the headlines of trained
runs are tested on planted records (tests/e2e/test_gpu_evidence.py).
Reference: docs/performance.md "The benchmark scripts".
"""

import collections
import glob
import os
import re
import sys

from benchmarks import gpu_evidence_study as study
from runrecord import record
from sweeps import scripts

# One command of a part: `argv` run as a subprocess (stdout to OUT/<part>/<label>.txt, stderr to
# <label>.err), or `call(ctx)` run in this process (its returned text written the same way);
# `ok` the exit codes that mean it ran to its end (pytest's 1: tests failed, a result); `expect`
# (ctx, step) -> None when its output meets the command's success criterion, else why not.
Step = collections.namedtuple(
  'Step', 'label argv env ok call expect', defaults=(None, {}, (0,), None, None)
)
Part = collections.namedtuple('Part', 'name minutes what steps headline')
# smoke: toy sizes on CPU; out: the evidence folder; folder: this part's folder in it.
Context = collections.namedtuple('Context', 'smoke out folder')

PY = sys.executable
GPU_STEP = '--config configs/celeba.py:gpu --image-size 224 --compute-dtype bfloat16'.split()
TOY_STEP = (
  '--config configs/celeba.py:gpu --image-size 16 --width 0.0625 --batch 8 --num-classes 10 '
  '--steps 1 --windows 1 --warmup 0'
).split()
ALL_VARIANTS = 'deterministic,nondeterministic,exclude_nondeterministic,deterministic_autotuned'
KEY_VALUE = re.compile(r'^([A-Za-z_]\w*)=(-?[0-9][0-9.e+-]*)$')
PYTEST_SUMMARY = re.compile(r'\d+ (passed|failed|skipped|errors?)\b.* in ')
MEM_FRACTION = re.compile(r'XLA_PYTHON_CLIENT_MEM_FRACTION=([0-9.]+)')
# Each benchmark's result line (its last `name=<number>` line): the command's success criterion.
RESULT_LINES = {
  'bench_determinism': r'\w+_vs_nondeterministic',
  'bench_pool': 'pool_speedup',
  'bench_vs_torch': 'speedup_vs_torch',
  'profile_step': 'device_busy_fraction',
  'bench_epoch': 'epoch_overhead_fraction',
}


def read(path):
  if not os.path.exists(path):
    return ''
  with open(path, encoding='utf-8', errors='replace') as f:
    return f.read()


def output(ctx, step):
  return read(os.path.join(ctx.folder, step.label + '.txt'))


def result_line(key):
  """The criterion of a benchmark: its stdout holds a `<key>=<number>` line (key a regex)."""
  pattern = re.compile(rf'^({key})=(-?[0-9][0-9.e+-]*)$', re.M)

  def expect(ctx, step):
    return None if pattern.search(output(ctx, step)) else f'no {key}=<number> result line'

  return expect


def module(name, *args):
  return Step(name, [PY, '-m', f'benchmarks.{name}', *args], expect=result_line(RESULT_LINES[name]))


def key_values(ctx):
  """'key=value; ...': the `name=<number>` lines of every command's output (the benchmarks' last
  lines), in order."""
  found = []
  for path in sorted(glob.glob(os.path.join(ctx.folder, '*.txt'))):
    found += [line.strip() for line in read(path).splitlines() if KEY_VALUE.match(line.strip())]
  return '; '.join(found) or 'no result line'


def pytest_summary(ctx):
  lines = [line.strip('= ') for line in read(os.path.join(ctx.folder, 'pytest.txt')).splitlines()]
  return next(
    (line for line in reversed(lines) if PYTEST_SUMMARY.search(line)), 'no pytest summary'
  )


def pytest_ran(ctx, step):
  """pytest's criterion: its summary line, and on the GPU a test that ran (not all skipped: the
  GPU tier skips everything where it finds no GPU)."""
  summary = pytest_summary(ctx)
  if summary == 'no pytest summary':
    return 'no pytest summary line'
  if not ctx.smoke and not re.search(r'\d+ (passed|failed)', summary):
    return f'no GPU test ran ({summary})'
  return None


def gpu_tier(ctx):
  env = {} if ctx.smoke else {'GPU_TESTS': '1'}
  return [Step('pytest', [PY, '-m', 'pytest', 'tests/gpu', '-q'], env, (0, 1), expect=pytest_ran)]


def determinism(batch, variants, extra=()):
  def steps(ctx):
    size = TOY_STEP if ctx.smoke else GPU_STEP + ['--batch', str(batch), *extra]
    return [module('bench_determinism', *size, '--variants', variants)]

  return steps


def determinism_256(ctx):
  toy_pool = '--batch 2 --size 8 --channels 4 --steps 1 --windows 1 --warmup 0'.split()
  pool = toy_pool if ctx.smoke else []
  return determinism(256, ALL_VARIANTS)(ctx) + [module('bench_pool', *pool)]


def vs_torch(batch, config=(), rounds=()):
  def steps(ctx):
    if ctx.smoke:
      size = (
        '--image-size 16 --width 0.0625 --batch 8 --num-classes 10 --steps 1 --rounds 1 '
        '--warmup 0 --no-compile'
      ).split()
    else:
      size = ['--image-size', '224', '--batch', str(batch), '--precision', 'bf16', *rounds]
    return [module('bench_vs_torch', *config, *size)]

  return steps


def profile_steps(ctx):
  if ctx.smoke:
    return [module('profile_step', *TOY_STEP, '--top', '5')]
  return [
    Step(
      f'profile_step_{b}',
      [PY, '-m', 'benchmarks.profile_step', *GPU_STEP, '--batch', str(b), '--top', '40'],
      expect=result_line(RESULT_LINES['profile_step']),
    )
    for b in (256, 2048)
  ]


def epoch_steps(ctx):
  if ctx.smoke:
    toy = '--train-examples 16 --test-examples 8 --repeats 1 --config.eval_batch_size=8'.split()
    return [module('bench_epoch', *TOY_STEP, *toy)]
  return [module('bench_epoch', *GPU_STEP)]


def sweep(ctx, label, spec, root, parallel, seeds=None):
  """sweeps.sweep of `spec` into `root`; at the toy size a dry run (every run's config, data and
  folder checked, the command list written where --emit-commands says, nothing trained: a
  train.py run costs a CPU more than the rest of the toy agenda). Its criterion: every run of the
  sweep (of `seeds`) completed; at the toy size, a command list of at least one run."""
  dry = (
    [
      '--dry-run',
      f'--emit-commands={study.commands_file(root)}',
      f'--emit-slurm={os.path.join(root, scripts.SLURM_FILE)}',
    ]
    if ctx.smoke
    else []
  )

  def expect(ctx, step):
    if ctx.smoke:
      return None if read(study.commands_file(root)).strip() else 'the dry run planned no run'
    found = [r for r in records(root).values() if seeds is None or (r or {}).get('seed') in seeds]
    done = sum(bool(r) and r.get('status') == 'completed' for r in found)
    return None if found and done == len(found) else f'{done} of {len(found)} runs completed'

  return Step(
    label,
    [
      PY,
      '-m',
      'sweeps.sweep',
      f'--config={spec}',
      f'--root={root}',
      f'--parallel={parallel}',
      '--heartbeat=60',
      *dry,
    ],
    ok=(0, 1),
    expect=expect,
  )


def planned(ctx, root):
  """The toy size's headline: how many runs the dry run planned (its command list)."""
  commands = read(study.commands_file(root)).splitlines()
  return f'dry run: {len(commands)} run(s) planned'


def shared_gpu(ctx):
  """Four runs at a time on the one GPU (a toy two on CPU): each gets the memory fraction."""
  spec = study.study_spec(ctx, 1)
  return [sweep(ctx, 'sweep', spec, os.path.join(ctx.folder, 'runs'), 4)]


def shared_gpu_headline(ctx):
  if ctx.smoke:
    return planned(ctx, os.path.join(ctx.folder, 'runs'))
  logs = glob.glob(os.path.join(ctx.folder, 'runs', '*', '*', record.LOG_FILE))
  found = [MEM_FRACTION.search(read(log)) for log in logs]  # the first header's settings
  fractions = collections.Counter(m.group(1) if m else 'none' for m in found)
  named = ', '.join(f'{v} in {n}' for v, n in sorted(fractions.items())) or 'none'
  return f'{runs_line(os.path.join(ctx.folder, "runs"))}; MEM_FRACTION in train.log: {named}'


def records(root):
  """{run path relative to root: its record (None: nothing saved)} (analysis.inputs.results)."""
  from analysis.inputs import results  # pandas: only when the records are read, not for --help

  return {
    os.path.relpath(run, root): r
    for run, r in results.read_all(root)
    if not isinstance(r, Exception)
  }


def runs_line(root, seeds=None):
  """'N of M runs completed; test accuracy mean (min-max)' of the runs under root (of `seeds`)."""
  return study.runs_summary(records(root).values(), seeds)


def export_step(label, roots, csv_path, spec):
  """The runs' records as one CSV and the study's declaration beside it (analysis.export), so the
  folder brought back holds them without the training states."""

  def call(ctx):
    from analysis import export

    export.main(['--runs', *roots, '--out', csv_path, '--study', spec])
    return f'wrote {csv_path}'

  def expect(ctx, step):
    written = os.path.exists(csv_path) and len(read(csv_path).splitlines()) > 1
    return None if written else f'{csv_path}: no table written'

  return Step(label, call=call, expect=expect)


def study_slice(first):
  """The study's seeds first..first+STUDY_SLICE-1 (gpu_evidence_study.seed_range)."""

  def steps(ctx):
    first_seed, last = study.seed_range(ctx, first)
    root = study.study_root(ctx)
    export = export_step(
      'export',
      [root],
      os.path.join(ctx.out, 'study', 'study.csv'),
      study.study_spec(ctx, study.STUDY_SEEDS),
    )
    return [
      sweep(
        ctx,
        'sweep',
        study.study_spec(ctx, study.STUDY_SEEDS, (first_seed, last)),
        root,
        study.STUDY_PARALLEL,
        range(first_seed, last + 1),
      )
    ] + ([] if ctx.smoke else [export])

  def headline(ctx):
    if ctx.smoke:
      return planned(ctx, study.study_root(ctx))
    first_seed, last = study.seed_range(ctx, first)
    return (
      f'seeds {first_seed}-{last}: '
      f'{runs_line(study.study_root(ctx), range(first_seed, last + 1))}; '
      f'whole root: {runs_line(study.study_root(ctx))}'
    )

  return steps, headline


def replicates(deterministic):
  """The study's arms x REPLICATE_SEEDS (gpu_evidence_study) seeds twice (roots a and b) with
  numerics.gpu_deterministic set: do same-seed runs end in the same model?"""

  def steps(ctx):
    spec = study.study_spec(
      ctx,
      study.REPLICATE_SEEDS if not ctx.smoke else 1,
      extra=f'numerics.gpu_deterministic={deterministic}',
    )
    roots = study.replicate_roots(ctx, deterministic)
    export = export_step('export', roots, os.path.dirname(roots[0]) + '.csv', spec)
    return [
      sweep(ctx, f'sweep_{os.path.basename(r)}', spec, r, study.STUDY_PARALLEL) for r in roots
    ] + ([] if ctx.smoke else [export])

  def headline(ctx):
    roots = study.replicate_roots(ctx, deterministic)
    return ' / '.join(planned(ctx, r) for r in roots) if ctx.smoke else replicate_line(*roots)

  return steps, headline


def replicate_line(root_a, root_b):
  """Same-seed pairs of root a and root b, both completed (study.replicate_summary)."""
  return study.replicate_summary(records(root_a), records(root_b))


def part(name, minutes, what, steps, headline=key_values):
  return Part(name, minutes, what, steps, headline)


# Minutes on an H100, the process's start included. Measured there (BENCHMARKS.md, 2026-11-24):
# bench_vs_torch at batch 2048, 3 rounds, 3.0 min (JAX's first call 107 s, torch.compile's 38 s);
# the digits study, 48 runs 6 at a time, 4 min 57 s (37 s a wave of runs); bench_step at batch 256,
# 16 s. The others are estimated from those (a batch-2048 compile ~110 s, a wave of runs ~37 s).
STUDY_PARTS = [
  part(
    f'study_seeds_{f}_{f + study.STUDY_SLICE - 1}',
    2.0,
    f'the digits study with its predictions, {study.STUDY_PARALLEL} runs at a time: 8 '
    f'arms x seeds {f}-{f + study.STUDY_SLICE - 1} of {study.STUDY_SEEDS}',
    *study_slice(f),
  )
  for f in range(0, study.STUDY_SEEDS, study.STUDY_SLICE)
]
PARTS = [
  part('gpu_tier', 3.0, 'GPU_TESTS=1 pytest tests/gpu', gpu_tier, pytest_summary),
  part(
    'determinism_256',
    4.0,
    'bench_determinism at batch 256 (all four variants) and bench_pool',
    determinism_256,
  ),
  part(
    'determinism_2048',
    5.0,
    "bench_determinism at batch 2048 (the study's): deterministic vs not",
    determinism(2048, 'deterministic,nondeterministic', ['--steps', '5', '--windows', '3']),
  ),
  part(
    'determinism_2048_xla',
    7.0,
    'bench_determinism at batch 2048: '
    'exclude_nondeterministic_ops and the autotuned deterministic compilation',
    determinism(
      2048,
      'nondeterministic,exclude_nondeterministic,deterministic_autotuned',
      ['--steps', '5', '--windows', '3'],
    ),
  ),
  part('vs_torch_256', 2.5, 'bench_vs_torch, bf16, batch 256', vs_torch(256)),
  part(
    'vs_torch_2048',
    3.5,
    "bench_vs_torch, bf16, batch 2048 (the study's): JAX against torch eager and torch.compile",
    vs_torch(2048, (), ['--rounds', '3']),
  ),
  part(
    'vs_torch_2048_deterministic',
    4.0,
    'bench_vs_torch, bf16, batch 2048, the gpu preset (deterministic)',
    vs_torch(2048, ('--config', 'configs/celeba.py:gpu'), ['--rounds', '3']),
  ),
  part(
    'profile_step', 5.0, 'profile_step at batch 256 and 2048 (deterministic preset)', profile_steps
  ),
  part(
    'bench_epoch',
    4.0,
    'bench_epoch: a CelebA epoch at batch 2048, its evaluation and save',
    epoch_steps,
  ),
  part(
    'shared_gpu',
    3.0,
    'four runs sharing the GPU (sweeps.sweep --parallel 4, 8 runs)',
    shared_gpu,
    shared_gpu_headline,
  ),
  *STUDY_PARTS,
  part(
    'replicates_deterministic_off',
    3.0,
    'the 8 arms x 2 seeds twice, gpu_deterministic=False',
    *replicates(False),
  ),
  part(
    'replicates_deterministic_on',
    3.0,
    'the 8 arms x 2 seeds twice, gpu_deterministic=True',
    *replicates(True),
  ),
]
# What each part's figures are worth, most first (the order benchmarks/gpu_plan.py fills a slot
# in): the cost of determinism and the step against torch.compile at the study's batch (2048);
# the study on the GPU with its predictions (its first slice); do same-seed runs differ without
# determinism; the GPU test tier; the declared seeds 0-5 of the study; the rest.
PRIORITY = (
  'determinism_2048',
  'vs_torch_2048',
  'study_seeds_0_1',
  'replicates_deterministic_off',
  'gpu_tier',
  'study_seeds_2_3',
  'study_seeds_4_5',
  'replicates_deterministic_on',
  'bench_epoch',
  'vs_torch_2048_deterministic',
  'determinism_256',
  'vs_torch_256',
  'shared_gpu',
  'profile_step',
  'determinism_2048_xla',
  *(p.name for p in STUDY_PARTS[3:]),
)
