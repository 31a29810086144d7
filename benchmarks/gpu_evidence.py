"""The GPU agenda as one program: every GPU measurement this project waits for, in parts of less
than 9 minutes on an H100, written into one folder to bring back. Also the config file of its
study parts: digits' study over more seeds, in slices (`benchmarks/gpu_evidence.py:study,seeds=16,
only=4-7`). Reference: docs/performance.md "The GPU evidence".

  python -m benchmarks.gpu_evidence --budget 15 --out runs/gpu_evidence   # a 15-minute slot's plan
  python -m benchmarks.gpu_evidence --smoke --out /tmp/evidence   # every part, toy size, CPU
"""

import collections
import contextlib
import csv
import glob
import importlib
import json
import os
import pathlib
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
from sweeps import runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS = 'benchmarks/gpu_evidence.py'
# The study's config: digits' arg plus `seeds=N` (declared in study.json), `only=A-B` (the seeds
# this sweep runs) and `arms=K` (the first K arms: a toy size).
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


def get_config(arg=None):
  """digits.get_config's own config: `analysis` reads the runs as runs of that study."""
  return digits.get_config(split_study_arg(arg)[0])


def get_sweep(arg=None):
  rest, mine = split_study_arg(arg)
  arms = digits.study_arms(digits.get_config(rest).batch_size)
  count = positive(mine, 'seeds', digits.SEEDS)
  first, _, last = mine.get('only', f'0-{count - 1}').partition('-')
  if not (first.isdigit() and last.isdigit() and int(first) <= int(last) < count):
    raise ValueError(f'{THIS}: only={mine["only"]}: give A-B with 0 <= A <= B < seeds={count}')
  seeds = range(int(first), int(last) + 1)
  return [{**arm, 'seed': s} for arm in arms[: positive(mine, 'arms', len(arms))] for s in seeds]


def get_study(arg=None):
  rest, mine = split_study_arg(arg)
  return {**digits.get_study(rest), 'seeds': positive(mine, 'seeds', digits.SEEDS)}


# One command of a part: `argv` run from the repository root (stdout to <label>.txt, stderr to
# .err) with `env` added; `ok`: the exit codes that mean it ran to its end (pytest's 1: tests
# failed, a result); `expect(ctx, step)`: why its output does not meet its criterion, or None.
Step = collections.namedtuple('Step', 'label argv env ok expect', defaults=({}, (0,), None))
Part = collections.namedtuple('Part', 'name minutes what steps headline')
# smoke: toy sizes on CPU; out: the evidence folder; folder: where this part's outputs are written.
Context = collections.namedtuple('Context', 'smoke out folder')

PY = sys.executable
# Benchmark commands at the GPU's size and at a toy size for CPU (smoke mode).
STEP = 'benchmarks.bench_step --config configs/celeba.py:gpu'
GPU_STEP = f'{STEP} --image-size 224 --compute-dtype bfloat16'
TOY = '--image-size 16 --width 0.0625 --batch 8 --num-classes 10 --steps 1 --windows 1 --warmup 0'
TOY_STEP = f'{STEP} {TOY}'
TORCH = 'benchmarks.bench_vs_torch --image-size 224 --compute-dtype bfloat16 --steps 5'
TOY_TORCH = f'benchmarks.bench_vs_torch --config configs/celeba.py:gpu {TOY} --no-compile'
KEY_VALUE = re.compile(r'^([A-Za-z_]\w*)=(-?[0-9][0-9.e+-]*)$')
PYTEST_SUMMARY = re.compile(r'\d+ (passed|failed|skipped|errors?)\b.* in ')
MEM_FRACTION = re.compile(r'XLA_PYTHON_CLIENT_MEM_FRACTION=([0-9.]+)')
MISSING_MODULE = re.compile(r"No module named '?([\w.]+)'?")
# The study: STUDY_SLICE seeds a part, STUDY_PARALLEL runs at a time; the replicates' seeds; the
# toy study (digits' smoke preset, one epoch of 6 steps, one arm).
STUDY_SEEDS, STUDY_SLICE, STUDY_PARALLEL, REPLICATE_SEEDS = 16, 2, 8, 2
TOY_STUDY = 'smoke,num_epochs=1,optim.freeze_epochs=0,batch_size=256,arms=1'


def read(path):
  return pathlib.Path(path).read_text('utf-8', 'replace') if os.path.exists(path) else ''


def result_line(key):
  """The criterion of a benchmark: its stdout holds a `<key>=<number>` line (key a regex)."""
  pattern = re.compile(rf'^({key})=(-?[0-9][0-9.e+-]*)$', re.M)

  def expect(ctx, step):
    found = pattern.search(read(os.path.join(ctx.folder, step.label + '.txt')))
    return None if found else f'no {key}=<number> result line'

  return expect


def bench(name, minutes, what, *commands):
  """A part of benchmark commands (label, result key, GPU command, toy command or None)."""

  def steps(ctx):
    return [
      Step(label, [PY, '-m', *(toy if ctx.smoke else gpu).split()], expect=result_line(key))
      for label, key, gpu, toy in commands
      if toy or not ctx.smoke
    ]

  return Part(name, minutes, what, steps, key_values)


def determinism(batch, variants, extra=''):
  mode = f'--mode determinism --variants {variants}'
  gpu = f'{GPU_STEP} --batch {batch} {extra} {mode}'
  return ('determinism', r'\w+_vs_nondeterministic', gpu, f'{TOY_STEP} {mode}')


def vs_torch(batch, preset='', windows=''):
  return ('vs_torch', 'speedup_vs_torch', f'{TORCH} {preset} --batch {batch} {windows}', TOY_TORCH)


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
  """pytest's criterion: its summary, and on the GPU a test run (the tier skips all without one)."""
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
  """{run path relative to root: its record (None: nothing saved)} (analysis.inputs)."""
  from analysis import inputs  # pandas: only when records are read

  found = inputs.read_all(root)
  return {os.path.relpath(run, root): r for run, r in found if not isinstance(r, Exception)}


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
  """Same-seed pairs of two roots: bit-identical final states, equal accuracies, largest gap."""
  a, b = records(root_a), records(root_b)
  both = [k for k in sorted(a.keys() & b.keys()) if a[k] and b[k]]
  pairs = [(a[k], b[k]) for k in both if a[k].get('status') == b[k].get('status') == 'completed']
  if not pairs:
    return 'no completed same-seed pair'
  digests = [(x.get('state_digest'), y.get('state_digest')) for x, y in pairs]
  same = sum(d is not None and d == e for d, e in digests)
  gaps = [abs(x['final']['test_accuracy'] - y['final']['test_accuracy']) * 100 for x, y in pairs]
  return (
    f'{len(pairs)} same-seed pairs: bit-identical final states {same}, equal test '
    f'accuracy {sum(g == 0 for g in gaps)}, largest accuracy difference {max(gaps):.2f} pp'
  )


def study_spec(ctx, seeds, only=None, extra=''):
  """This file's study spec (the toy study in smoke mode) over `seeds`, of them `only`."""
  only = f'only={only[0]}-{only[-1]}' if only else ''
  parts = [TOY_STUDY if ctx.smoke else 'study', extra, f'seeds={seeds}', only]
  return f'{THIS}:' + ','.join(p for p in parts if p)


def planned(root):
  """The toy size's headline: how many runs the dry run planned (its command list)."""
  planned = len(read(os.path.join(root, runner.COMMANDS_FILE)).splitlines())
  return f'dry run: {planned} run(s) planned'


def sweep(ctx, label, spec, root, parallel, seeds=None):
  """sweeps.sweep of `spec` into `root` (a dry run at the toy size); met when every run is done."""
  commands = os.path.join(root, runner.COMMANDS_FILE)

  def expect(ctx, step):
    if ctx.smoke:
      return None if read(commands).strip() else 'the dry run planned no run'
    found = [r for r in records(root).values() if seeds is None or (r or {}).get('seed') in seeds]
    done = sum(bool(r) and r.get('status') == 'completed' for r in found)
    return None if found and done == len(found) else f'{done} of {len(found)} runs completed'

  argv = [PY, '-m', 'sweeps.sweep', f'--config={spec}', f'--root={root}']
  argv += [f'--parallel={parallel}', '--heartbeat=60']
  if ctx.smoke:
    slurm = os.path.join(root, runner.SLURM_FILE)
    argv += ['--dry-run', f'--emit-commands={commands}', f'--emit-slurm={slurm}']
  return Step(label, argv, ok=(0, 1), expect=expect)


def export_step(roots, csv_path, spec):
  """The runs' records as one CSV with the study's declaration (analysis.export, on the CPU)."""

  def expect(ctx, step):
    return None if len(read(csv_path).splitlines()) > 1 else f'{csv_path}: no table written'

  argv = [PY, '-m', 'analysis.export', '--runs', *roots, '--out', csv_path, '--study', spec]
  return Step('export', argv, {'JAX_PLATFORMS': 'cpu'}, expect=expect)


def shared_gpu(ctx):
  """Four runs at a time on the one GPU: each gets its memory fraction."""
  return [sweep(ctx, 'sweep', study_spec(ctx, 1), os.path.join(ctx.out, 'shared_gpu', 'runs'), 4)]


def shared_gpu_headline(ctx):
  root = os.path.join(ctx.out, 'shared_gpu', 'runs')
  if ctx.smoke:
    return planned(root)
  logs = glob.glob(os.path.join(root, '*', '*', record.LOG_FILE))
  found = [MEM_FRACTION.search(read(log)) for log in logs]  # the first header's settings
  fractions = collections.Counter(m.group(1) if m else 'none' for m in found)
  named = ', '.join(f'{v} in {n}' for v, n in sorted(fractions.items())) or 'none'
  return f'{runs_line(root)}; MEM_FRACTION in train.log: {named}'


def study_slice(first):
  """The study's seeds first..first+STUDY_SLICE-1 (seed 0 at the toy size): steps, headline."""

  def seeds(ctx):
    return range(0, 1) if ctx.smoke else range(first, first + STUDY_SLICE)

  def root(ctx):
    return os.path.join(ctx.out, 'study', 'runs')

  def steps(ctx):
    spec = study_spec(ctx, STUDY_SEEDS, seeds(ctx))
    run = sweep(ctx, 'sweep', spec, root(ctx), STUDY_PARALLEL, seeds(ctx))
    if ctx.smoke:
      return [run]
    csv_path = os.path.join(ctx.out, 'study', 'study.csv')
    return [run, export_step([root(ctx)], csv_path, study_spec(ctx, STUDY_SEEDS))]

  def headline(ctx):
    if ctx.smoke:
      return planned(root(ctx))
    s = seeds(ctx)
    return f'seeds {s[0]}-{s[-1]}: {runs_line(root(ctx), s)}; whole root: {runs_line(root(ctx))}'

  return steps, headline


def replicates(deterministic):
  """The study's arms x REPLICATE_SEEDS seeds twice: do same-seed runs end in the same model?"""

  def roots(ctx):
    folder = os.path.join(ctx.out, 'replicates', f'gpu_deterministic_{deterministic}')
    return [os.path.join(folder, name) for name in ('a', 'b')]

  def steps(ctx):
    seeds = 1 if ctx.smoke else REPLICATE_SEEDS
    spec = study_spec(ctx, seeds, extra=f'numerics.gpu_deterministic={deterministic}')
    a, b = roots(ctx)
    runs = [sweep(ctx, f'sweep_{os.path.basename(r)}', spec, r, STUDY_PARALLEL) for r in (a, b)]
    return runs if ctx.smoke else runs + [export_step([a, b], os.path.dirname(a) + '.csv', spec)]

  def headline(ctx):
    return ' / '.join(map(planned, roots(ctx))) if ctx.smoke else replicate_line(*roots(ctx))

  return steps, headline


# Minutes on an H100, the process's start included. Measured there (BENCHMARKS.md, 2026-11-24):
# against torch at batch 2048, 3 rounds, 3.0 min (JAX's first call 107 s, torch.compile's 38 s);
# the digits study, 48 runs 6 at a time, 4 min 57 s (37 s a wave of runs); the step at batch 256,
# 16 s. The others are estimated from those (a batch-2048 compile ~110 s, a wave of runs ~37 s).
STUDY_PARTS = [
  Part(f'study_seeds_{f}_{f + STUDY_SLICE - 1}', 2.0, f'the study, seeds from {f}', *study_slice(f))
  for f in range(0, STUDY_SEEDS, STUDY_SLICE)
]
FIVE = '--steps 5 --windows 3'
POOL = 'benchmarks.bench_conv --pool'
TOY_POOL = f'{POOL} --batch 2 --size 8 --channels 4 --steps 1 --windows 1 --warmup 0'
TOY_EPOCH = f'{TOY_STEP} --mode epoch --train-examples 16 --test-examples 8 --repeats 1'
TOY_EPOCH += ' --config.eval_batch_size=8'
EPOCH = ('epoch', 'epoch_overhead_fraction', f'{GPU_STEP} --mode epoch', TOY_EPOCH)
XLA = 'nondeterministic,exclude_nondeterministic,deterministic_autotuned'
ALL_VARIANTS = f'deterministic,{XLA}'
PRESET = '--config configs/celeba.py:gpu'
PROFILE = '--mode profile --top'
TOY_PROFILE = f'{TOY_STEP} {PROFILE} 5'
PARTS = [
  Part('gpu_tier', 3.0, 'GPU_TESTS=1 pytest tests/gpu', gpu_tier, pytest_summary),
  bench(
    'determinism_256',
    4.0,
    'deterministic ops or not, batch 256, four variants; the max pool',
    determinism(256, ALL_VARIANTS),
    ('pool', 'pool_speedup', POOL, TOY_POOL),
  ),
  bench(
    'determinism_2048',
    5.0,
    "deterministic ops or not at the study's batch, 2048",
    determinism(2048, 'deterministic,nondeterministic', FIVE),
  ),
  bench('determinism_2048_xla', 7.0, 'the XLA variants at 2048', determinism(2048, XLA, FIVE)),
  bench('vs_torch_256', 2.5, 'against torch, bf16, batch 256', vs_torch(256)),
  bench('vs_torch_2048', 3.5, 'against torch, bf16, batch 2048', vs_torch(2048, '', '--windows 3')),
  bench('vs_torch_2048_deterministic', 4.0, 'gpu preset', vs_torch(2048, PRESET, '--windows 3')),
  bench(
    'profile',
    5.0,
    'profiles at batch 256 and 2048',
    ('profile_256', 'device_busy_fraction', f'{GPU_STEP} --batch 256 {PROFILE} 40', TOY_PROFILE),
    ('profile_2048', 'device_busy_fraction', f'{GPU_STEP} --batch 2048 {PROFILE} 40', None),
  ),
  bench('epoch', 4.0, 'a CelebA epoch at batch 2048, its evaluation and save', EPOCH),
  Part('shared_gpu', 3.0, 'four runs sharing the GPU', shared_gpu, shared_gpu_headline),
  *STUDY_PARTS,
  Part('replicates_deterministic_off', 3.0, 'the 8 arms x 2 seeds twice', *replicates(False)),
  Part('replicates_deterministic_on', 3.0, 'the same, gpu_deterministic=True', *replicates(True)),
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

# Running the parts: a part is `completed` only when each command exited as expected and met its
# criterion; every file written into the evidence folder goes through runrecord/files.py.
STATUS_FILE = 'status.json'
SUMMARY_FILES = ['summary.csv', 'summary.md']
SUMMARY_COLUMNS = ('part', 'h100_minutes', 'status', 'minutes', 'headline')
PART_MINUTES = 9.0  # the lent machine's commands end at 10 minutes
GRACE_S = 20  # after SIGTERM, before SIGKILL (the sweep stops its runs in between)
# Smoke mode: CPU, every compile in one cache, compiled without most optimisations.
SMOKE_ENV = {
  'JAX_PLATFORMS': 'cpu',
  'JAX_DISABLE_MOST_OPTIMIZATIONS': '1',
  'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
}


def run_step(step, ctx, seconds_left):
  """The step's exit code (None: stopped at the part's time limit), its stdout and stderr in
  <label>.txt and .err. Smoke mode runs `python -m benchmarks.X` and `-m sweeps.sweep` as
  X.main(args) in this process: one set of imports and compilations for every toy part."""
  path, argv = os.path.join(ctx.folder, step.label), step.argv
  here = ctx.smoke and not step.env and argv[2].startswith(('benchmarks.', 'sweeps.'))
  with open(path + '.txt', 'w') as out, open(path + '.err', 'w') as err:
    if here:
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
          code = importlib.import_module(argv[2]).main(argv[3:])
        except SystemExit as e:
          code = e.code
        except Exception:  # a failed command is a result of the part: its traceback in .err
          traceback.print_exc()
          code = 1
      return code if isinstance(code, int) else (0 if code is None else 2)
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', **step.env}
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH')]))
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True)
    try:
      return proc.wait(timeout=max(1.0, seconds_left))
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGTERM)  # the sweep stops its runs, then SIGKILL
      try:
        proc.wait(timeout=GRACE_S)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
      return None


def run_part(part, out, smoke, part_minutes):
  """Run the part's commands; its status. Its files replace OUT/<part>'s together when it ends."""
  status = {'part': part.name, 'smoke': smoke, 'status': 'completed', 'commands': []}
  status['started'], start = common.host(), time.time()

  def write(staging):
    ctx = Context(smoke, out, os.path.join(staging, part.name))
    os.makedirs(ctx.folder)
    for step in part.steps(ctx):
      began = time.time()
      code = run_step(step, ctx, part_minutes * 60 - (began - start))
      failure = 'timed out' if code is None else f'exit {code}' if code not in step.ok else None
      failure = failure or (step.expect and step.expect(ctx, step))
      missing = MISSING_MODULE.findall(read(os.path.join(ctx.folder, step.label + '.err')))
      if failure and missing:
        failure += f'; missing module {missing[-1]} (No module named {missing[-1]})'
      seconds, command = round(time.time() - began, 1), ' '.join(step.argv)
      ran = dict(label=step.label, exit_code=code, seconds=seconds, command=command)
      status['commands'].append({**ran, 'criterion': failure or 'met'})
      if failure:
        status['status'] = 'timed out' if code is None else f'failed: {step.label}: {failure}'
        break
    status['minutes'] = round((time.time() - start) / 60, 2)
    try:
      status['headline'] = part.headline(ctx)
    except Exception as e:  # a part's outputs may be partial: said so, the traceback on stderr
      traceback.print_exc()
      status['headline'] = f'no headline ({type(e).__name__}: {e})'
    with open(os.path.join(ctx.folder, STATUS_FILE), 'w', encoding='utf-8') as f:
      json.dump(status, f, indent=1)
    return glob.glob(os.path.join(ctx.folder, '*'))

  names = part_files(part, out, smoke)
  with files.Destination(out, command=f'gpu_evidence {part.name}', may_write=names) as dest:
    dest.write(write)
  return status


def part_files(part, out, smoke):
  """The files a part writes into the evidence folder."""
  steps = part.steps(Context(smoke, out, None))
  labels = [step.label + ext for step in steps for ext in ('.txt', '.err')]
  return [os.path.join(part.name, name) for name in [STATUS_FILE, *labels]]


def read_status(out, name):
  path = os.path.join(out, name, STATUS_FILE)
  return json.loads(read(path)) if os.path.exists(path) else None


def is_done(status, smoke):
  return bool(status) and status['status'] == 'completed' and status['smoke'] == smoke


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

  def write(staging):
    with open(os.path.join(staging, 'summary.csv'), 'w', newline='', encoding='utf-8') as f:
      writer = csv.DictWriter(f, SUMMARY_COLUMNS)
      writer.writeheader()
      writer.writerows(rows)
    cells = [[str(r[c]).replace('|', '/') for c in SUMMARY_COLUMNS] for r in rows]
    header = ['part', 'expected minutes (H100)', 'status', 'minutes', 'headline']
    with open(os.path.join(staging, 'summary.md'), 'w', encoding='utf-8') as f:
      f.write(f'# GPU evidence ({common.host()})\n\n{common.table(header, cells)}\n')
    return [os.path.join(staging, name) for name in SUMMARY_FILES]

  with files.Destination(out, command='gpu_evidence', may_write=SUMMARY_FILES) as dest:
    dest.write(write)
  return rows


def pack(out, path):
  """OUT as a .tar.gz at `path`, no training states or compilation cache; its size in bytes."""

  def keep(info):
    parts = info.name.split('/')
    state = len(parts) >= 3 and parts[-3] == record.CHECKPOINTS and parts[-1] == record.STATE_ITEM
    busy = parts[-1].startswith(files.STAGING) or parts[-1].endswith('.lock')
    return None if state or busy or '.jax_cache' in parts else info

  def write(staging):
    staged = os.path.join(staging, os.path.basename(os.path.realpath(path)))
    with tarfile.open(staged, 'w:gz') as tar:
      tar.add(out, arcname=os.path.basename(os.path.abspath(out)), filter=keep)
    return [staged]

  with files.Destination(path, command='gpu_evidence pack', folder=False, flag='--pack') as dest:
    return os.path.getsize(dest.write(write)[0])


# A slot of device time: a fresh machine's start-up (counted once), then calls of at most
# CALL_MINUTES each, each paying OVERHEAD (transfer, wheels, Python and JAX start).
STARTUP_MINUTES = 3.0
CALL_MINUTES = 9.0  # a device command ends at 10 minutes: a call's overhead and parts stay under 9
OVERHEAD = 0.5  # minutes
Call = collections.namedtuple('Call', 'parts minutes')  # minutes: overhead + the parts'
Plan = collections.namedtuple('Plan', 'calls later too_long total budget startup overhead limit')


def by_priority(parts, priority):
  """`parts` in the order of `priority` (names); parts it does not name come last, in order."""
  rank = {name: i for i, name in enumerate(priority)}
  return sorted(parts, key=lambda p: rank.get(p.name, len(rank)))


def make_plan(
  parts, priority, budget, done=(), startup=STARTUP_MINUTES, limit=CALL_MINUTES, overhead=OVERHEAD
):
  """The Plan of a `budget`-minute slot for the `parts` not `done`, filled in priority order."""
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

  smoke = ' --smoke' if smoke else ''
  flags = f'--out {out}{smoke} --call-minutes {plan.limit - plan.overhead:g}'
  lines = [
    f'GPU plan for a {plan.budget:g}-minute slot (expected minutes on an H100): start-up '
    f'{plan.startup:g} min, then calls of at most {plan.limit:g} min each, {plan.overhead:g} min '
    'of each for its transfer and start'
  ]
  for i, call in enumerate(plan.calls, 1):
    lines.append(f'call {i} ({call.minutes:g} min): {listed(call.parts)}')
    names = ','.join(p.name for p in call.parts)
    lines.append(f'  python -m benchmarks.gpu_evidence --part {names} {flags}')
  if not plan.calls:
    rest = plan.later or plan.too_long
    lines.append('no part fits this slot' if rest else 'nothing to run: every part is completed')
  parts = f'{len(plan.calls)} call(s), {sum(len(c.parts) for c in plan.calls)} part(s)'
  lines.append(f'planned: {plan.total:g} of {plan.budget:g} min ({parts})')
  if plan.later:
    minutes = sum(p.minutes for p in plan.later)
    lines.append(f'next slot ({len(plan.later)} part(s), {minutes:g} min): {listed(plan.later)}')
  if plan.too_long:
    lines.append('longer than a call (split them): ' + ','.join(p.name for p in plan.too_long))
  return lines


def main(argv=None):
  p = common.parser('gpu_evidence', __doc__)
  p.add_argument('--list', action='store_true', help='each part and its minutes on an H100')
  p.add_argument('--budget', type=float, metavar='MIN', help='plan a MIN-minute slot; runs nothing')
  p.add_argument('--part', help="'all' or part names, comma-separated, run in that order")
  p.add_argument('--out', help='the evidence folder (one per machine)')
  p.add_argument('--smoke', action='store_true', help='toy sizes on CPU (every part by default)')
  p.add_argument('--force', action='store_true', help='run parts already completed again')
  stop = 'a part still running after this is stopped (default %(default)s)'
  p.add_argument('--part-minutes', type=float, default=PART_MINUTES, help=stop)
  p.add_argument('--call-minutes', type=float, help='start only parts expected to end within it')
  p.add_argument('--pack', metavar='FILE', help='pack --out into a .tar.gz, no training states')
  args = p.parse_args(argv)
  for name in ('budget', 'part_minutes', 'call_minutes'):
    value = getattr(args, name)
    if value is not None and not 0 <= value < float('inf'):
      common.fail(f'--{name.replace("_", "-")}={value}: give a number of minutes, 0 or more')
  if args.list:
    for p in PARTS:
      print(f'{p.name:30s} {p.minutes:4.1f} min  {p.what}')
    print(f'{len(PARTS)} parts, {sum(p.minutes for p in PARTS):g} minutes on an H100 in all')
    return 0
  if args.budget is not None:
    out = args.out if args.out and os.path.isdir(args.out) else None
    done = {p.name for p in PARTS if out and is_done(read_status(out, p.name), args.smoke)}
    plan = make_plan(PARTS, PRIORITY, args.budget, done)
    print('\n'.join(describe(plan, args.out or 'runs/gpu_evidence', args.smoke)))
    return 0
  if not args.out:
    common.fail('--out: give the evidence folder, e.g. --out runs/gpu_evidence')
  if args.pack:
    if not os.path.isdir(args.out):
      common.fail(f'--out={args.out}: no evidence folder there to pack')
    try:
      print(f'wrote {args.pack}: {pack(args.out, args.pack) / 2**20:.1f} MiB')
    except ValueError as e:  # a folder, a file this project did not write, a full disk
      common.fail(str(e))
    return 0
  if not args.part and not args.smoke:
    common.fail('--part: give all or part names (--list), or --smoke')
  known = {p.name: p for p in PARTS}  # 'all' (by PRIORITY) or names, in the order given
  wanted = [n.strip() for n in (args.part or 'all').split(',') if n.strip()]
  bad = set(wanted) - set(known) or not wanted or len(set(wanted)) < len(wanted)
  if bad and wanted != ['all']:
    common.fail(
      f'--part={args.part}: give all or part names among {", ".join(known)} (--list), each once'
    )
  parts = by_priority(PARTS, PRIORITY) if wanted == ['all'] else [known[n] for n in wanted]
  out = os.path.abspath(args.out)
  names = SUMMARY_FILES + [n for part in parts for n in part_files(part, out, args.smoke)]
  try:  # a file of the user's where a part would write: refused before any part runs
    with files.Destination(out, command='gpu_evidence', may_write=names):
      pass
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
    late = not args.smoke and args.call_minutes is not None
    if left or (late and (time.time() - start) / 60 + part.minutes > args.call_minutes):
      left.append(part.name)
      continue
    print(f'{part.name}: running (expected {part.minutes:g} min on an H100)', flush=True)
    status = run_part(part, out, args.smoke, args.part_minutes)
    failed += status['status'] != 'completed'
    print(f'{part.name}: {status["status"]} in {status["minutes"]} min: {status["headline"]}')
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
