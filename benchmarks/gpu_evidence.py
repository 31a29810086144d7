"""The GPU agenda as one program: every GPU measurement this project waits for, in parts of less
than 9 minutes on an H100, written into one folder to bring back.

  python -m benchmarks.gpu_evidence --list                        # each part, minutes on an H100
  python -m benchmarks.gpu_evidence --budget 15 --out runs/gpu_evidence   # a 15-minute slot's plan
  python -m benchmarks.gpu_evidence --part all --out runs/gpu_evidence   # the parts not done yet
  python -m benchmarks.gpu_evidence --pack $OUT/gpu_evidence.tar.gz --out runs/gpu_evidence
  python -m benchmarks.gpu_evidence --smoke --out /tmp/evidence   # every part, toy size, CPU

This file is also the config file its study parts sweep: configs/digits.py's study over more seeds,
in slices (`--config=benchmarks/gpu_evidence.py:study,seeds=16,only=4-7`).
Reference: docs/performance.md "The GPU evidence".
"""

import argparse
import collections
import contextlib
import csv
import glob
import importlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import traceback

from benchmarks import common
from configs import digits
from runrecord import files, record
from sweeps import scripts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS = 'benchmarks/gpu_evidence.py'

# The study's config: configs/digits.py's arg plus `seeds=N` (declared in study.json), `only=A-B`
# (the seeds this sweep runs) and `arms=K` (the first K arms: a toy size).
STUDY_KEYS = ('seeds', 'only', 'arms')


def split_study_arg(arg):
  """(digits' arg, {key: text} of STUDY_KEYS) from the arg after the colon."""
  rest, mine = [], {}
  for item in filter(None, (s.strip() for s in (arg or '').split(','))):
    key, eq, value = item.partition('=')
    if eq and key.strip() in STUDY_KEYS:
      mine[key.strip()] = value.strip()
    else:
      rest.append(item)
  return ','.join(rest), mine


def positive(mine, key, default):
  text = mine.get(key, str(default))
  if not text.isdigit() or int(text) < 1:
    raise ValueError(f'{THIS}: {key}={text}: give a positive whole number')
  return int(text)


def study_seeds(mine):
  """The seeds this sweep runs: `only=A-B` within range(`seeds`)."""
  count = positive(mine, 'seeds', digits.SEEDS)
  first, _, last = mine.get('only', f'0-{count - 1}').partition('-')
  if not (first.isdigit() and last.isdigit() and int(first) <= int(last) < count):
    raise ValueError(f'{THIS}: only={mine["only"]}: give A-B with 0 <= A <= B < seeds={count}')
  return range(int(first), int(last) + 1)


def get_config(arg=None):
  """digits.get_config's own config: `analysis` reads the runs as runs of that study."""
  return digits.get_config(split_study_arg(arg)[0])


def get_sweep(arg=None):
  rest, mine = split_study_arg(arg)
  arms = digits.study_arms(digits.get_config(rest).batch_size)
  arms = arms[: positive(mine, 'arms', len(arms))]
  return [{**arm, 'seed': seed} for arm in arms for seed in study_seeds(mine)]


def get_study(arg=None):
  rest, mine = split_study_arg(arg)
  return {**digits.get_study(rest), 'seeds': positive(mine, 'seeds', digits.SEEDS)}


# One command of a part: `argv` run from the repository root, or `call(ctx)` run in this process
# (what either prints goes to OUT/<part>/<label>.txt and .err); `ok`: the exit codes that mean it
# ran to its end (pytest's 1: tests failed, a result); `expect(ctx, step)`: None when its output
# meets the command's success criterion, else why not.
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
TOY_TORCH = (
  '--image-size 16 --width 0.0625 --batch 8 --num-classes 10 --steps 1 --rounds 1 --warmup 0 '
  '--no-compile'
).split()
TOY_POOL = '--batch 2 --size 8 --channels 4 --steps 1 --windows 1 --warmup 0'.split()
ALL_VARIANTS = 'deterministic,nondeterministic,exclude_nondeterministic,deterministic_autotuned'
KEY_VALUE = re.compile(r'^([A-Za-z_]\w*)=(-?[0-9][0-9.e+-]*)$')
PYTEST_SUMMARY = re.compile(r'\d+ (passed|failed|skipped|errors?)\b.* in ')
MEM_FRACTION = re.compile(r'XLA_PYTHON_CLIENT_MEM_FRACTION=([0-9.]+)')
MISSING_MODULE = re.compile(r"No module named '?([\w.]+)'?")
# The study: STUDY_SLICE seeds a part, STUDY_PARALLEL runs at a time; the replicates' seeds; the
# toy study (digits' smoke preset, one epoch of 6 steps, one arm).
STUDY_SEEDS, STUDY_SLICE, STUDY_PARALLEL, REPLICATE_SEEDS = 16, 2, 8, 2
TOY_STUDY = 'smoke,num_epochs=1,optim.freeze_epochs=0,batch_size=256,arms=1'


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


def bench(name, minutes, what, *commands):
  """A part of benchmark commands (label, module, result key, GPU args, toy args; None: not run
  at the toy size), each met by its result line; its headline: their result lines."""

  def steps(ctx):
    return [
      Step(
        label, [PY, '-m', f'benchmarks.{m}', *(toy if ctx.smoke else gpu)], expect=result_line(key)
      )
      for label, m, key, gpu, toy in commands
      if not (ctx.smoke and toy is None)
    ]

  return Part(name, minutes, what, steps, key_values)


MODULES = {'determinism': 'bench_determinism', 'profile': 'profile_step', 'epoch': 'bench_epoch'}


def step_mode(label, mode, key, gpu, toy=()):
  """`bench_step --mode MODE` with `gpu` added to GPU_STEP, or `toy` (None: not run) to TOY_STEP."""
  toy = None if toy is None else [*TOY_STEP, *toy]
  return (label, MODULES[mode], key, [*GPU_STEP, *gpu], toy)


def determinism(batch, variants, extra=()):
  variants = ['--variants', variants]
  return step_mode(
    'determinism',
    'determinism',
    r'\w+_vs_nondeterministic',
    ['--batch', str(batch), *extra, *variants],
    variants,
  )


def vs_torch(batch, config=(), rounds=()):
  gpu = [*config, '--image-size', '224', '--batch', str(batch), '--precision', 'bf16', *rounds]
  return ('vs_torch', 'bench_vs_torch', 'speedup_vs_torch', gpu, [*config, *TOY_TORCH])


def key_values(ctx):
  """'key=value; ...': the `name=<number>` lines of every command's output, in order."""
  found = []
  for path in sorted(glob.glob(os.path.join(ctx.folder, '*.txt'))):
    found += [line.strip() for line in read(path).splitlines() if KEY_VALUE.match(line.strip())]
  return '; '.join(found) or 'no result line'


def pytest_summary(ctx):
  lines = [line.strip('= ') for line in read(os.path.join(ctx.folder, 'pytest.txt')).splitlines()]
  return next((ln for ln in reversed(lines) if PYTEST_SUMMARY.search(ln)), 'no pytest summary')


def pytest_ran(ctx, step):
  """pytest's criterion: its summary line, and on the GPU a test that ran (the GPU tier skips
  everything where it finds no GPU)."""
  summary = pytest_summary(ctx)
  if summary == 'no pytest summary':
    return 'no pytest summary line'
  if not ctx.smoke and not re.search(r'\d+ (passed|failed)', summary):
    return f'no GPU test ran ({summary})'
  return None


def gpu_tier(ctx):
  env = {} if ctx.smoke else {'GPU_TESTS': '1'}
  return [Step('pytest', [PY, '-m', 'pytest', 'tests/gpu', '-q'], env, (0, 1), expect=pytest_ran)]


def records(root):
  """{run path relative to root: its record (None: nothing saved)} (analysis.inputs.results)."""
  from analysis.inputs import results  # pandas: only when records are read

  return {
    os.path.relpath(run, root): r
    for run, r in results.read_all(root)
    if not isinstance(r, Exception)
  }


def runs_line(root, seeds=None):
  """'N of M runs completed; test accuracy mean (min-max)' of the runs under root (of `seeds`)."""
  found = [r for r in records(root).values() if r and (seeds is None or r.get('seed') in seeds)]
  done = [r for r in found if r.get('status') == 'completed']
  accuracy = [100 * r['final']['test_accuracy'] for r in done if 'test_accuracy' in r['final']]
  line = f'{len(done)} of {len(found)} runs completed'
  if accuracy:
    mean = sum(accuracy) / len(accuracy)
    line += f'; test accuracy mean {mean:.2f} % ({min(accuracy):.2f}-{max(accuracy):.2f})'
  return line


def replicate_line(root_a, root_b):
  """Same-seed pairs of two roots, both completed: how many end in bit-identical states (the
  record's state_digest, a CRC-32 of every leaf) and with equal test accuracy, and the largest
  accuracy difference |a - b| in pp."""
  a, b = records(root_a), records(root_b)
  pairs = [
    (a[k], b[k])
    for k in sorted(a.keys() & b.keys())
    if a[k] and b[k] and a[k].get('status') == b[k].get('status') == 'completed'
  ]
  if not pairs:
    return 'no completed same-seed pair'
  same = sum(
    x.get('state_digest') is not None and x.get('state_digest') == y.get('state_digest')
    for x, y in pairs
  )
  gaps = [abs(x['final']['test_accuracy'] - y['final']['test_accuracy']) * 100 for x, y in pairs]
  return (
    f'{len(pairs)} same-seed pairs: bit-identical final states {same}, equal test '
    f'accuracy {sum(g == 0 for g in gaps)}, largest accuracy difference {max(gaps):.2f} pp'
  )


def study_spec(ctx, seeds, only=None, extra=''):
  """This file's study spec (the toy study in smoke mode) over `seeds`, of them `only`."""
  only = f'only={only[0]}-{only[1]}' if only else ''
  parts = [TOY_STUDY if ctx.smoke else 'study', extra, f'seeds={seeds}', only]
  return f'{THIS}:' + ','.join(p for p in parts if p)


def commands_file(root):
  return os.path.join(root, scripts.COMMANDS_FILE)


def planned(root):
  """The toy size's headline: how many runs the dry run planned (its command list)."""
  return f'dry run: {len(read(commands_file(root)).splitlines())} run(s) planned'


def sweep(ctx, label, spec, root, parallel, seeds=None):
  """sweeps.sweep of `spec` into `root`; at the toy size a dry run (checked and planned, not
  trained). Its criterion: every run (of `seeds`) completed; at the toy size, a run planned."""
  dry = [
    '--dry-run',
    f'--emit-commands={commands_file(root)}',
    f'--emit-slurm={os.path.join(root, scripts.SLURM_FILE)}',
  ]

  def expect(ctx, step):
    if ctx.smoke:
      return None if read(commands_file(root)).strip() else 'the dry run planned no run'
    found = [r for r in records(root).values() if seeds is None or (r or {}).get('seed') in seeds]
    done = sum(bool(r) and r.get('status') == 'completed' for r in found)
    return None if found and done == len(found) else f'{done} of {len(found)} runs completed'

  argv = [PY, '-m', 'sweeps.sweep', f'--config={spec}', f'--root={root}']
  argv += [f'--parallel={parallel}', '--heartbeat=60', *(dry if ctx.smoke else [])]
  return Step(label, argv, ok=(0, 1), expect=expect)


def shared_gpu(ctx):
  """Four runs at a time on the one GPU: each gets its memory fraction."""
  return [sweep(ctx, 'sweep', study_spec(ctx, 1), os.path.join(ctx.folder, 'runs'), 4)]


def shared_gpu_headline(ctx):
  root = os.path.join(ctx.folder, 'runs')
  if ctx.smoke:
    return planned(root)
  logs = glob.glob(os.path.join(root, '*', '*', record.LOG_FILE))
  found = [MEM_FRACTION.search(read(log)) for log in logs]  # the first header's settings
  fractions = collections.Counter(m.group(1) if m else 'none' for m in found)
  named = ', '.join(f'{v} in {n}' for v, n in sorted(fractions.items())) or 'none'
  return f'{runs_line(root)}; MEM_FRACTION in train.log: {named}'


def export_step(roots, csv_path, spec):
  """The runs' records as one CSV with the study's declaration (analysis.export): the folder
  brought back holds them without the training states."""

  def call(ctx):
    from analysis import export

    export.main(['--runs', *roots, '--out', csv_path, '--study', spec])
    print(f'wrote {csv_path}')

  def expect(ctx, step):
    written = len(read(csv_path).splitlines()) > 1
    return None if written else f'{csv_path}: no table written'

  return Step('export', call=call, expect=expect)


def study_slice(first):
  """The study's seeds first..first+STUDY_SLICE-1 (seed 0 at the toy size): steps, headline."""

  def seeds(ctx):
    return range(0, 1) if ctx.smoke else range(first, first + STUDY_SLICE)

  def root(ctx):
    return os.path.join(ctx.out, 'study', 'runs')

  def steps(ctx):
    s = seeds(ctx)
    spec = study_spec(ctx, STUDY_SEEDS, (s[0], s[-1]))
    csv_path = os.path.join(ctx.out, 'study', 'study.csv')
    export = export_step([root(ctx)], csv_path, study_spec(ctx, STUDY_SEEDS))
    run = sweep(ctx, 'sweep', spec, root(ctx), STUDY_PARALLEL, s)
    return [run] + ([] if ctx.smoke else [export])

  def headline(ctx):
    if ctx.smoke:
      return planned(root(ctx))
    s = seeds(ctx)
    return f'seeds {s[0]}-{s[-1]}: {runs_line(root(ctx), s)}; whole root: {runs_line(root(ctx))}'

  return steps, headline


def replicates(deterministic):
  """The study's arms x REPLICATE_SEEDS seeds twice (roots a and b) with
  numerics.gpu_deterministic set: do same-seed runs end in the same model?"""

  def roots(ctx):
    folder = os.path.join(ctx.out, 'replicates', f'gpu_deterministic_{deterministic}')
    return [os.path.join(folder, name) for name in ('a', 'b')]

  def steps(ctx):
    seeds = 1 if ctx.smoke else REPLICATE_SEEDS
    spec = study_spec(ctx, seeds, extra=f'numerics.gpu_deterministic={deterministic}')
    a, b = roots(ctx)
    runs = [sweep(ctx, f'sweep_{os.path.basename(r)}', spec, r, STUDY_PARALLEL) for r in (a, b)]
    return runs + ([] if ctx.smoke else [export_step([a, b], os.path.dirname(a) + '.csv', spec)])

  def headline(ctx):
    return ' / '.join(map(planned, roots(ctx))) if ctx.smoke else replicate_line(*roots(ctx))

  return steps, headline


# Minutes on an H100, the process's start included. Measured there (BENCHMARKS.md, 2026-11-24):
# bench_vs_torch at batch 2048, 3 rounds, 3.0 min (JAX's first call 107 s, torch.compile's 38 s);
# the digits study, 48 runs 6 at a time, 4 min 57 s (37 s a wave of runs); bench_step at batch 256,
# 16 s. The others are estimated from those (a batch-2048 compile ~110 s, a wave of runs ~37 s).
STUDY_PARTS = [
  Part(
    f'study_seeds_{f}_{f + STUDY_SLICE - 1}',
    2.0,
    f'the digits study with its predictions, {STUDY_PARALLEL} runs at a time: 8 arms x seeds '
    f'{f}-{f + STUDY_SLICE - 1} of {STUDY_SEEDS}',
    *study_slice(f),
  )
  for f in range(0, STUDY_SEEDS, STUDY_SLICE)
]
FIVE_STEPS = ['--steps', '5', '--windows', '3']
ROUNDS = ['--rounds', '3']
POOL: tuple = ('pool', 'bench_pool', 'pool_speedup', [], TOY_POOL)
EPOCH_TOY = '--train-examples 16 --test-examples 8 --repeats 1 --config.eval_batch_size=8'.split()
PARTS = [
  Part('gpu_tier', 3.0, 'GPU_TESTS=1 pytest tests/gpu', gpu_tier, pytest_summary),
  bench(
    'determinism_256',
    4.0,
    'deterministic ops at batch 256 (four variants); the pool',
    determinism(256, ALL_VARIANTS),
    POOL,
  ),
  bench(
    'determinism_2048',
    5.0,
    "deterministic ops at batch 2048 (the study's) or not",
    determinism(2048, 'deterministic,nondeterministic', FIVE_STEPS),
  ),
  bench(
    'determinism_2048_xla',
    7.0,
    'exclude_nondeterministic_ops, autotuned deterministic ops at 2048',
    determinism(
      2048, 'nondeterministic,exclude_nondeterministic,deterministic_autotuned', FIVE_STEPS
    ),
  ),
  bench('vs_torch_256', 2.5, 'bench_vs_torch, bf16, batch 256', vs_torch(256)),
  bench(
    'vs_torch_2048',
    3.5,
    'bench_vs_torch, bf16, batch 2048: torch eager and torch.compile',
    vs_torch(2048, (), ROUNDS),
  ),
  bench(
    'vs_torch_2048_deterministic',
    4.0,
    'bench_vs_torch, bf16, batch 2048, the gpu preset',
    vs_torch(2048, ('--config', 'configs/celeba.py:gpu'), ROUNDS),
  ),
  bench(
    'profile',
    5.0,
    'a profile of the step at batch 256 and 2048 (deterministic preset)',
    step_mode(
      'profile_256',
      'profile',
      'device_busy_fraction',
      ['--batch', '256', '--top', '40'],
      ['--top', '5'],
    ),
    step_mode(
      'profile_2048', 'profile', 'device_busy_fraction', ['--batch', '2048', '--top', '40'], None
    ),
  ),
  bench(
    'epoch',
    4.0,
    'a CelebA epoch at batch 2048: its evaluation and save',
    step_mode('epoch', 'epoch', 'epoch_overhead_fraction', [], EPOCH_TOY),
  ),
  Part(
    'shared_gpu',
    3.0,
    'four runs sharing the GPU (sweeps.sweep --parallel 4)',
    shared_gpu,
    shared_gpu_headline,
  ),
  *STUDY_PARTS,
  Part(
    'replicates_deterministic_off',
    3.0,
    'the 8 arms x 2 seeds twice, gpu_deterministic=False',
    *replicates(False),
  ),
  Part(
    'replicates_deterministic_on',
    3.0,
    'the 8 arms x 2 seeds twice, gpu_deterministic=True',
    *replicates(True),
  ),
]
# What each part's figures are worth, most first (the order a slot is filled in): the cost of
# determinism and the step against torch.compile at the study's batch (2048); the study on the
# GPU with its predictions (its first slice); do same-seed runs differ without determinism; the
# GPU test tier; the declared seeds 0-5 of the study; the rest.
PRIORITY = (
  'determinism_2048 vs_torch_2048 study_seeds_0_1 replicates_deterministic_off gpu_tier '
  'study_seeds_2_3 study_seeds_4_5 replicates_deterministic_on epoch vs_torch_2048_deterministic '
  'determinism_256 vs_torch_256 shared_gpu profile determinism_2048_xla'
).split() + [p.name for p in STUDY_PARTS[3:]]

# Running the parts. A part is `completed` only when each command exited as expected and met its
# criterion; its status and every output go into the evidence folder through runrecord/files.py.
STATUS_FILE = 'status.json'
SUMMARY_COLUMNS = ('part', 'h100_minutes', 'status', 'minutes', 'headline')
PART_MINUTES = 9.0  # the lent machine's commands end at 10 minutes
GRACE_S = 20  # after SIGTERM, before SIGKILL (the sweep stops its runs in between)
# Smoke mode: CPU, every compile in one cache, compiled without most optimisations.
SMOKE_ENV = {
  'JAX_PLATFORMS': 'cpu',
  'JAX_DISABLE_MOST_OPTIMIZATIONS': '1',
  'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
}


def write_into(out, names, write, by):
  """`write(staging)` -> the staged paths, moved into the evidence folder as `names` (a file there
  that this project did not write is refused, never replaced); `by` names the writer."""
  with files.Destination(out, command=f'gpu_evidence {by}', may_write=names) as dest:
    return dest.write(write)


def staged(staging, name):
  path = os.path.join(staging, name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return path


def write_texts(out, texts, by):
  """{name: text} written into the evidence folder (write_into)."""

  def write(staging):
    paths = [staged(staging, name) for name in texts]
    for path, text in zip(paths, texts.values(), strict=True):
      with open(path, 'w', encoding='utf-8') as f:
        f.write(text)
    return paths

  return write_into(out, list(texts), write, by)


def step_names(ctx, step):
  base = os.path.join(os.path.basename(ctx.folder), step.label)
  return [base + '.txt', base + '.err']


def in_process(step, ctx):
  """Smoke mode runs `python -m benchmarks.X ...` and `python -m sweeps.sweep ...` as
  X.main(args) in this process: one set of imports and compilations for every toy part."""
  argv = step.argv or ['', '']
  return (
    ctx.smoke
    and not step.env
    and argv[1] == '-m'
    and argv[2].startswith(('benchmarks.', 'sweeps.'))
  )


def run_here(step, ctx, out, err):
  """Exit code of step.call(ctx), or of module.main(argv), run in this process."""
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      if step.call:
        code = step.call(ctx)
      else:
        code = importlib.import_module(step.argv[2]).main(step.argv[3:])
    except SystemExit as e:
      code = e.code
    except Exception:  # a failed command is a result of the part: its traceback in <label>.err
      traceback.print_exc()
      code = 1
  return code if isinstance(code, int) else (0 if code is None else 2)


def run_subprocess(step, out, err, seconds_left):
  """Exit code of the step's subprocess (None: stopped at the part's time limit)."""
  env = {**os.environ, 'PYTHONUNBUFFERED': '1', **step.env}
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
  proc = subprocess.Popen(
    step.argv, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True
  )
  try:
    return proc.wait(timeout=max(1.0, seconds_left))
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
      proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
    return None


def run_step(step, ctx, seconds_left):
  """The step's exit code (None: timed out), its stdout and stderr in <part>/<label>.txt, .err."""
  names, code = step_names(ctx, step), None

  def write(staging):
    nonlocal code
    paths = [staged(staging, name) for name in names]
    with open(paths[0], 'w') as out, open(paths[1], 'w') as err:
      if step.call or in_process(step, ctx):
        code = run_here(step, ctx, out, err)
      else:
        code = run_subprocess(step, out, err, seconds_left)
    return paths

  write_into(ctx.out, names, write, names[0][:-4])
  return code


def step_failure(step, ctx, code):
  """None when the command ran as expected and met its criterion, else why not (one line): its
  exit code, the module its stderr says is missing, the criterion it did not meet."""
  why = None
  if code is None:
    why = 'timed out'
  elif code not in step.ok:
    why = f'exit {code}'
  elif step.expect:
    why = step.expect(ctx, step)
  if why is None:
    return None
  found = MISSING_MODULE.findall(read(os.path.join(ctx.folder, step.label + '.err')))
  return f'{why}; missing module {found[-1]} (No module named {found[-1]})' if found else why


def write_status(ctx, status):
  name = os.path.join(os.path.basename(ctx.folder), STATUS_FILE)
  write_texts(ctx.out, {name: json.dumps(status, indent=1)}, name)


def read_status(out, name):
  path = os.path.join(out, name, STATUS_FILE)
  return json.loads(read(path)) if os.path.exists(path) else None


def is_done(status, smoke):
  return bool(status) and status['status'] == 'completed' and status['smoke'] == smoke


def run_part(part, out, smoke, part_minutes):
  """Run the part's commands; returns its status (also OUT/<part>/status.json)."""
  ctx = Context(smoke, out, os.path.join(out, part.name))
  status = {'part': part.name, 'smoke': smoke, 'status': 'running', 'commands': []}
  status.update(started=common.host(), minutes=0.0, headline='')
  write_status(ctx, status)
  start = time.time()
  for step in part.steps(ctx):
    began = time.time()
    code = run_step(step, ctx, part_minutes * 60 - (began - start))
    failure = step_failure(step, ctx, code)
    status['commands'].append(
      {
        'label': step.label,
        'exit_code': code,
        'seconds': round(time.time() - began, 1),
        'command': ' '.join(step.argv) if step.argv else 'in process',
        'criterion': failure or 'met',
      }
    )
    if failure:
      status['status'] = 'timed out' if code is None else f'failed: {step.label}: {failure}'
      break
  else:
    status['status'] = 'completed'
  status['minutes'] = round((time.time() - start) / 60, 2)
  try:
    status['headline'] = part.headline(ctx)
  except Exception as e:  # a part's outputs may be partial: say so, the traceback on stderr
    traceback.print_exc()
    status['headline'] = f'no headline ({type(e).__name__}: {e})'
  write_status(ctx, status)
  return status


def summary_rows(out):
  rows = []
  for p in PARTS:
    s = read_status(out, p.name) or {'status': 'not run', 'minutes': '', 'headline': ''}
    status = s['status'] + (' (smoke)' if s.get('smoke') else '')
    values = (p.name, p.minutes, status, s['minutes'], s['headline'])
    rows.append(dict(zip(SUMMARY_COLUMNS, values, strict=True)))
  return rows


def write_summary(out):
  """OUT/summary.csv and OUT/summary.md: every part of the agenda, run or not."""
  rows = summary_rows(out)
  table = io.StringIO()
  writer = csv.DictWriter(table, SUMMARY_COLUMNS, lineterminator='\n')
  writer.writeheader()
  writer.writerows(rows)
  lines = [f'# GPU evidence ({common.host()})', '']
  lines += [
    '| part | expected minutes (H100) | status | minutes | headline |',
    '|---|---|---|---|---|',
  ]
  lines += [
    ' '.join(['|', ' | '.join(str(r[c]).replace('|', '/') for c in SUMMARY_COLUMNS), '|'])
    for r in rows
  ]
  write_texts(
    out, {'summary.csv': table.getvalue(), 'summary.md': '\n'.join(lines) + '\n'}, 'summary'
  )
  return rows


def pack(out, path):
  """OUT as a .tar.gz at `path` without the runs' training states (checkpoints/<step>/state), the
  compilation cache or a write in progress; its size in bytes."""

  def keep(info):
    parts = info.name.split('/')
    state = len(parts) >= 3 and parts[-3] == record.CHECKPOINTS and parts[-1] == record.STATE_ITEM
    busy = parts[-1].startswith(files.STAGING) or parts[-1].endswith('.lock')
    return None if state or busy or '.jax_cache' in parts else info

  def write(staging):
    staged_path = os.path.join(staging, os.path.basename(os.path.realpath(path)))
    with tarfile.open(staged_path, 'w:gz') as tar:
      tar.add(out, arcname=os.path.basename(os.path.abspath(out)), filter=keep)
    return [staged_path]

  with files.Destination(path, command='gpu_evidence pack', folder=False, flag='--pack') as dest:
    return os.path.getsize(dest.write(write)[0])


def check_out(out, parts, smoke):
  """Refuse, before any part runs, an evidence folder where a file this program would write is
  one this project did not write (one line naming them)."""
  names = ['summary.csv', 'summary.md']
  for part in parts:
    ctx = Context(smoke, out, os.path.join(out, part.name))
    names.append(os.path.join(part.name, STATUS_FILE))
    names += [n for step in part.steps(ctx) for n in step_names(ctx, step)]
  with files.Destination(out, command='gpu_evidence', may_write=names):
    pass


# A slot of device time: a fresh machine's start-up (counted once), then calls of at most
# CALL_MINUTES each, each paying CALL_OVERHEAD_MINUTES (transfer, wheels, Python and JAX start).
STARTUP_MINUTES = 3.0
CALL_MINUTES = 9.0  # a device command ends at 10 minutes: a call's overhead and parts stay under 9
CALL_OVERHEAD_MINUTES = 0.5
Call = collections.namedtuple('Call', 'parts minutes')  # minutes: overhead + the parts'
Plan = collections.namedtuple('Plan', 'calls later too_long total budget startup overhead limit')


def by_priority(parts, priority):
  """`parts` in the order of `priority` (names); parts it does not name come last, in order."""
  rank = {name: i for i, name in enumerate(priority)}
  return sorted(parts, key=lambda p: rank.get(p.name, len(rank)))


def make_plan(
  parts,
  priority,
  budget,
  done=(),
  startup=STARTUP_MINUTES,
  limit=CALL_MINUTES,
  overhead=CALL_OVERHEAD_MINUTES,
):
  """The Plan of a `budget`-minute slot for the `parts` not `done`: in priority order, each joins
  the current call if it fits there and in the budget, else opens the next call if that fits,
  else waits for the next slot; a part longer than a call is listed as such."""
  calls, later, too_long, total = [], [], [], startup
  for part in by_priority([p for p in parts if p.name not in done], priority):
    if overhead + part.minutes > limit:
      too_long.append(part)
    elif calls and calls[-1].minutes + part.minutes <= limit and total + part.minutes <= budget:
      calls[-1] = Call(calls[-1].parts + [part], calls[-1].minutes + part.minutes)
      total += part.minutes
    elif total + overhead + part.minutes <= budget:
      calls.append(Call([part], overhead + part.minutes))
      total += overhead + part.minutes
    else:
      later.append(part)
  return Plan(calls, later, too_long, total, budget, startup, overhead, limit)


def describe(plan, out, smoke=False):
  """The plan as `--budget` prints it: each call with its command, the total, the rest."""

  def listed(parts):
    return ', '.join(f'{p.name} ({p.minutes:g})' for p in parts)

  flags = f'--out {out}' + (' --smoke' if smoke else '')
  lines = [
    f'GPU plan for a {plan.budget:g}-minute slot (expected minutes on an H100): start-up '
    f'{plan.startup:g} min, then calls of at most {plan.limit:g} min each, {plan.overhead:g} min '
    'of each for its transfer and start'
  ]
  for i, call in enumerate(plan.calls, 1):
    lines.append(f'call {i} ({call.minutes:g} min): {listed(call.parts)}')
    lines.append(
      f'  python -m benchmarks.gpu_evidence --part {",".join(p.name for p in call.parts)} '
      f'{flags} --call-minutes {plan.limit - plan.overhead:g}'
    )
  if not plan.calls:
    rest = plan.later or plan.too_long
    lines.append('no part fits this slot' if rest else 'nothing to run: every part is completed')
  parts = sum(len(c.parts) for c in plan.calls)
  lines.append(
    f'planned: {plan.total:g} of {plan.budget:g} min ({len(plan.calls)} call(s), {parts} part(s))'
  )
  if plan.later:
    minutes = sum(p.minutes for p in plan.later)
    lines.append(f'next slot ({len(plan.later)} part(s), {minutes:g} min): {listed(plan.later)}')
  if plan.too_long:
    lines.append('longer than a call (split them): ' + ','.join(p.name for p in plan.too_long))
  return lines


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.gpu_evidence', description=common.description(__doc__)
  )
  p.add_argument('--list', action='store_true', help='print each part and its minutes on an H100')
  p.add_argument(
    '--budget',
    type=float,
    metavar='MIN',
    help='print the plan of a slot of MIN minutes of device time (start-up counted; the parts '
    'not completed in --out): its calls, their commands, what is left; runs nothing',
  )
  p.add_argument(
    '--startup-minutes',
    type=float,
    default=STARTUP_MINUTES,
    help="a fresh machine's start-up, counted once in --budget (default %(default)s)",
  )
  p.add_argument(
    '--part', help="'all' (by what their figures are worth) or part names, comma-separated"
  )
  p.add_argument('--out', help='the evidence folder (one per machine)')
  p.add_argument('--smoke', action='store_true', help='toy sizes on CPU (every part by default)')
  p.add_argument('--force', action='store_true', help='run parts already completed again')
  p.add_argument(
    '--part-minutes',
    type=float,
    default=PART_MINUTES,
    help='a part still running after this is stopped (status: timed out)',
  )
  p.add_argument(
    '--call-minutes',
    type=float,
    help='start a part only if its expected minutes on an H100 end within this many minutes '
    "of the command's start (the rest: the next call); not in --smoke",
  )
  p.add_argument('--pack', metavar='FILE', help='write --out there as a .tar.gz, no states')
  args = p.parse_args(argv)
  for name in ('budget', 'startup_minutes', 'part_minutes', 'call_minutes'):
    value = getattr(args, name)
    if value is not None and not 0 <= value < float('inf'):
      common.fail(f'--{name.replace("_", "-")}={value}: give a number of minutes, 0 or more')
  return args


def parts_named(names):
  """'all' (by PRIORITY) or comma-separated names, in the order given; one line on a bad one."""
  known = {p.name: p for p in PARTS}
  wanted = [n.strip() for n in names.split(',') if n.strip()]
  if wanted == ['all']:
    return by_priority(PARTS, PRIORITY)
  if set(wanted) - set(known) or not wanted or len(set(wanted)) != len(wanted):
    common.fail(
      f'--part={names}: give all or part names among {", ".join(known)} (--list), each once'
    )
  return [known[n] for n in wanted]


def completed(out, smoke):
  if not out or not os.path.isdir(out):
    return set()
  return {p.name for p in PARTS if is_done(read_status(out, p.name), smoke)}


def main(argv=None):
  args = parse_args(argv)
  if args.list:
    for p in PARTS:
      print(f'{p.name:30s} {p.minutes:4.1f} min  {p.what}')
    print(f'{len(PARTS)} parts, {sum(p.minutes for p in PARTS):g} minutes on an H100 in all')
    return 0
  if args.budget is not None:
    done = completed(args.out, args.smoke)
    plan = make_plan(PARTS, PRIORITY, args.budget, done, args.startup_minutes)
    print('\n'.join(describe(plan, args.out or 'runs/gpu_evidence', args.smoke)))
    return 0
  if not args.out:
    common.fail('--out: give the evidence folder, e.g. --out runs/gpu_evidence')
  if args.pack:
    if not os.path.isdir(args.out):
      common.fail(f'--out={args.out}: no evidence folder there to pack')
    try:
      size = pack(args.out, args.pack)
    except files.WriteFailed as e:  # a full disk, permissions: nothing was moved into place
      print(f'error: {e}', file=sys.stderr)
      return 1
    except ValueError as e:  # the archive's path: a folder, a file this project did not write
      common.fail(str(e))
    print(f'wrote {args.pack}: {size / 2**20:.1f} MiB')
    return 0
  if not args.part and not args.smoke:
    common.fail('--part: give all or part names (--list), or --smoke')
  parts = parts_named(args.part or 'all')
  out = os.path.abspath(args.out)
  try:
    check_out(out, parts, args.smoke)
  except ValueError as e:
    common.fail(str(e))
  if args.smoke:  # before anything here starts JAX
    os.environ.update(SMOKE_ENV)
    os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(REPO, '.jax_cache'))
  else:  # this process reads run records (Orbax starts JAX): on the CPU, never on the GPU
    import jax

    jax.config.update('jax_platforms', 'cpu')
  failed, start, left = 0, time.time(), []
  for part in parts:
    if is_done(read_status(out, part.name), args.smoke) and not args.force:
      print(f'{part.name}: completed already (skipped; --force runs it again)')
      continue
    elapsed = (time.time() - start) / 60
    late = not args.smoke and args.call_minutes is not None
    if left or (late and elapsed + part.minutes > args.call_minutes):
      left.append(part.name)
      continue
    print(f'{part.name}: running (expected {part.minutes:g} min on an H100)', flush=True)
    status = run_part(part, out, args.smoke, args.part_minutes)
    failed += status['status'] != 'completed'
    print(
      f'{part.name}: {status["status"]} in {status["minutes"]} min: {status["headline"]}',
      flush=True,
    )
    write_summary(out)
  write_summary(out)
  if left:
    print(
      f'not started (past --call-minutes {args.call_minutes:g}): {",".join(left)}: run the '
      'same command again in the next call'
    )
  print(f'summary: {os.path.join(out, "summary.md")}')
  return 1 if failed or left else 0


if __name__ == '__main__':
  sys.exit(main())
