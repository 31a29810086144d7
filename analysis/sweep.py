"""Run a study (arms x seeds, declared by the config file's `get_sweep(arg)`) as train.py runs.

  python -m analysis.sweep --config=configs/digits.py:study --root=/tmp/study [--parallel 2]
  python -m analysis.sweep --config=configs/celeba.py:gpu --root=/runs/celeba --gpus 0,1,2,3
  python -m analysis.sweep --config=configs/celeba.py:tpu --root=gs://b/study --dry-run \
      --emit-commands=cmds.txt --emit-slurm=study.sbatch

`get_sweep(arg)` returns a list of override dicts, one per run: any config fields by dotted name,
`seed` included. The runs with equal overrides apart from `seed` form an arm; each run goes to
`<root>/<arm slug>/seed<k>` and is launched as

  python train.py --config=<file>:<arg> --workdir=<run dir> --config.seed=<k> --config.<f>=<v> ...

so each run can be repeated from its command alone. Runs whose saved results say 'completed' are
skipped; the others are (re)launched and the trainer resumes them from their latest checkpoint.
Each run's output is appended to `<run dir>/train.log`. The command list (one run per line) and a
SLURM job-array script that runs line $SLURM_ARRAY_TASK_ID of it are written next to the runs
(or where --emit-commands / --emit-slurm say). The exit code is 1 if any run failed.
"""

import argparse
import collections
import os
import re
import shlex
import subprocess
import sys
import time

from configs import loader
from trainer import record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS_FILE = 'sweep_commands.txt'
SLURM_FILE = 'sweep.sbatch'
LOG_FILE = 'train.log'
CACHE_DIR = '.jax_cache'

Run = collections.namedtuple('Run', 'arm slug seed overrides workdir')


def config_leaves(tree, prefix=''):
  """Every dotted field name of a config dict."""
  out = []
  for key, value in tree.items():
    name = f'{prefix}{key}'
    out.extend(config_leaves(value, name + '.') if isinstance(value, dict) else [name])
  return out


def short_name(field, leaves):
  """The field's last part when no other config field ends the same way, else its dotted name."""
  leaf = field.rsplit('.', 1)[-1]
  same = [f for f in leaves if f.rsplit('.', 1)[-1] == leaf]
  return leaf if len(same) <= 1 else field


def slug_value(value):
  text = ','.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
  return re.sub(r'[^A-Za-z0-9.+-]+', '-', text).strip('-') or 'empty'


def arm_slug(arm, leaves):
  """'emulate-bf16_compute_dtype-bfloat16': fields in the arm's order, from the arm alone (stable
  when arms are added or removed); 'default' for an arm without overrides."""
  parts = [f'{short_name(k, leaves)}-{slug_value(v)}' for k, v in arm.items()]
  return '_'.join(parts) or 'default'


def check_overrides(module, arg, overrides, index):
  """Apply the run's overrides to the config (one-line error naming the field); returns it."""
  config = module.get_config(arg)
  try:
    return loader.apply_overrides(config, overrides.items())
  except ValueError as e:
    raise ValueError(f'get_sweep() run {index}: {e}; use a dotted field of get_config()') from None


def expand(spec, root):
  """(runs, config file, arg): the sweep of `spec` with one workdir per run under `root`."""
  path, arg = loader.split_spec(spec)
  module = loader.load_module(path)
  if not hasattr(module, 'get_sweep'):
    raise ValueError(f'--config: {path} has no get_sweep(arg); add one returning a list of '
                     'override dicts (arms x seeds)')
  sweep = module.get_sweep(arg or None)
  if not sweep or not all(isinstance(o, dict) for o in sweep):
    raise ValueError(f'{path}: get_sweep() must return a non-empty list of override dicts')
  leaves = config_leaves(module.get_config(arg).to_dict())
  runs, slugs, seen = [], {}, set()
  for i, overrides in enumerate(sweep):
    config = check_overrides(module, arg, overrides, i)
    arm = {k: v for k, v in overrides.items() if k != 'seed'}
    slug, seed = arm_slug(arm, leaves), int(config.seed)
    if slugs.setdefault(slug, arm) != arm:
      raise ValueError(f'get_sweep(): arms {slugs[slug]} and {arm} share the folder name {slug!r}; '
                       'make their values differ in more than punctuation')
    if (slug, seed) in seen:
      raise ValueError(f'get_sweep(): arm {slug!r} lists seed {seed} twice; each seed once per arm')
    seen.add((slug, seed))
    runs.append(Run(arm, slug, seed, {'seed': seed, **arm}, join(root, slug, f'seed{seed}')))
  return runs, path, arg


def join(root, *parts):  # not os.path.join: roots may be bucket paths
  return '/'.join([root.rstrip('/'), *parts])


def flag_value(value):
  """A config value as absl's --config.<field>= parses it back."""
  if isinstance(value, str):
    return value
  return repr(tuple(value) if isinstance(value, list) else value)


def command(run, path, arg, python='python'):
  """The run's train.py argv, relative to the repository root."""
  rel = os.path.relpath(path, REPO)
  config = rel if not rel.startswith('..') else path
  argv = [python, 'train.py', f'--config={config}' + (f':{arg}' if arg else ''),
          f'--workdir={run.workdir}']
  return argv + [f'--config.{k}={flag_value(v)}' for k, v in run.overrides.items()]


def command_line(argv):
  return ' '.join(shlex.quote(a) for a in argv)


def slurm_script(commands_file, count, root, job_name):
  """A job array of `count` tasks; task i runs line i (0-based) of `commands_file`."""
  return '\n'.join([
      '#!/bin/bash',
      f'#SBATCH --job-name={job_name}',
      f'#SBATCH --array=0-{count - 1}',
      f'#SBATCH --output={os.path.join(os.path.dirname(commands_file), "slurm-%A_%a.out")}',
      '#SBATCH --ntasks=1',
      '# Add resource lines, e.g. #SBATCH --gres=gpu:1. Task i runs line i (0-based) of the list;',
      '# completed runs return at once, unfinished ones resume from their latest checkpoint.',
      'set -euo pipefail',
      f'cd {shlex.quote(REPO)}',
      f'export JAX_COMPILATION_CACHE_DIR="${{JAX_COMPILATION_CACHE_DIR:-{join(root, CACHE_DIR)}}}"',
      f'CMD=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(commands_file)})',
      'echo "task $SLURM_ARRAY_TASK_ID: $CMD"',
      'eval "$CMD"',
      ''])


def write_text(path, text):
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def saved_state(run, path, arg, module):
  """('completed'|'todo'|'mismatch', detail) from the run's saved record, if any.

  A saved run is this sweep's run when trainer/record.py's rule says so (the rule train.py's
  resume uses): then a completed one is skipped and an unfinished one relaunched, and train.py
  resumes it. Any other saved run is a conflict, named with its differing fields.
  """
  from analysis import results  # pylint: disable=import-outside-toplevel
  if '://' in run.workdir or not os.path.isdir(str(record.checkpoint_dir(run.workdir))):
    return 'todo', ''  # bucket runs: the trainer on the host skips completed ones
  try:
    with results.quiet_absl():
      saved = record.read_results(run.workdir)
  except Exception as e:  # pylint: disable=broad-except
    return 'todo', f'unreadable results ({type(e).__name__}); relaunching'
  if not saved:
    return 'todo', ''
  wanted = check_overrides(module, arg, run.overrides, 0).to_dict()
  diffs = record.config_differences(saved.get('config'), wanted)
  if diffs:
    return 'mismatch', (f'{run.workdir} holds a run with other settings ({"; ".join(diffs[:3])}): '
                        'delete it or use another --root')
  return ('completed', '') if saved.get('status') == 'completed' else ('todo', '')


def fmt_duration(seconds):
  if seconds is None:
    return '?'
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  return (f'{h}h' if h else '') + f'{rest // 60:d}m{rest % 60:02d}s'


def last_line(path):
  """The last non-empty line of a log file ('' if none)."""
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, os.path.getsize(path) - 8192))
      lines = [l.strip() for l in f.read().decode(errors='replace').splitlines() if l.strip()]
  except OSError:
    return ''
  return lines[-1] if lines else ''


def child_env(root, gpu=None):
  """The environment of a run: the shared compilation cache (unless set), one GPU when given."""
  env = dict(os.environ)
  env.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(root, CACHE_DIR))
  env.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')  # JAX's default: 1 s
  env['PYTHONPATH'] = REPO + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  if gpu is not None:
    env['CUDA_VISIBLE_DEVICES'] = str(gpu)
  return env


class Progress:
  """Counts of done/running/failed runs and the one-line report with elapsed time and ETA."""

  def __init__(self, total, done, slots, out=None):
    self.total, self.done, self.slots, self.out = total, done, slots, out
    self.running, self.failed, self.durations = 0, 0, []
    self.start = self.last_shown = time.time()

  def eta(self):
    left = self.total - self.done - self.failed
    if not left:
      return 0.0
    if not self.durations:
      return None
    return sum(self.durations) / len(self.durations) * left / self.slots

  def line(self):
    elapsed = time.time() - self.start
    return (f'[sweep] {self.done}/{self.total} done, {self.running} running, {self.failed} failed'
            f' | elapsed {fmt_duration(elapsed)} | ETA {fmt_duration(self.eta())}')

  def show(self, message=None):
    self.last_shown = time.time()
    out = self.out or sys.stdout
    if message:
      print(message, file=out)
    print(self.line(), file=out, flush=True)


def launch(run, argv, root, gpu):
  os.makedirs(run.workdir, exist_ok=True)
  log = open(os.path.join(run.workdir, LOG_FILE), 'a')
  log.write(f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")} {command_line(argv)}\n')
  log.flush()
  proc = subprocess.Popen(argv, cwd=REPO, env=child_env(root, gpu), stdout=log,
                          stderr=subprocess.STDOUT)
  return proc, log


def launch_order(runs):
  """Round-robin over arms (each arm's first seed, then each arm's second, ...): runs started
  together compile different arms, and later seeds of an arm find its compiles in the cache."""
  arms = list(dict.fromkeys(r.slug for r in runs))
  rank = {id(r): i for arm in arms for i, r in enumerate(x for x in runs if x.slug == arm)}
  return sorted(runs, key=lambda r: (rank[id(r)], arms.index(r.slug)))


def run_all(todo, path, arg, root, progress, slots, gpus, poll=0.5, heartbeat=60):
  """Launch `todo` runs, `slots` at a time (GPU ids from `gpus`); returns [(run, code, line)]."""
  queue, active, failures = launch_order(todo), {}, []
  free_gpus = list(gpus)[:slots] if gpus else [None] * slots
  try:
    while queue or active:
      while queue and free_gpus:
        run, gpu = queue.pop(0), free_gpus.pop(0)
        proc, log = launch(run, command(run, path, arg, sys.executable), root, gpu)
        active[proc.pid] = (run, proc, log, gpu, time.time())
        progress.running += 1
        progress.show(f'start {run.slug}/seed{run.seed}' + (f' on GPU {gpu}' if gpu is not None else ''))
      time.sleep(poll)
      if time.time() - progress.last_shown > heartbeat:
        progress.show()
      for pid in [p for p, a in active.items() if a[1].poll() is not None]:
        run, proc, log, gpu, started = active.pop(pid)
        log.close()
        free_gpus.append(gpu)
        progress.running -= 1
        logfile = os.path.join(run.workdir, LOG_FILE)
        if proc.returncode == 0:
          progress.done += 1
          progress.durations.append(time.time() - started)
          progress.show(f'done  {run.slug}/seed{run.seed} in {fmt_duration(time.time() - started)}')
        else:
          progress.failed += 1
          failures.append((run, proc.returncode, last_line(logfile)))
          progress.show(f'FAILED {run.slug}/seed{run.seed}: exit code {proc.returncode}, last log '
                        f'line: {last_line(logfile)!r} (log: {logfile})')
  except KeyboardInterrupt:
    for run, proc, log, _, _ in active.values():
      proc.terminate()
    for run, proc, log, _, _ in active.values():
      proc.wait()
      log.close()
    raise
  return failures


def parse_gpus(text):
  try:
    return [int(g) for g in text.split(',') if g.strip()]
  except ValueError:
    raise ValueError(f'--gpus={text}: give comma-separated GPU ids, e.g. --gpus 0,1,2,3') from None


def add_run_args(p, example_config, root_help):
  """--config, --root, --parallel, --gpus: what running a sweep takes (analysis.study too)."""
  p.add_argument('--config', required=True,
                 help=f'config file with get_sweep(), e.g. {example_config}')
  p.add_argument('--root', required=True, help=root_help)
  p.add_argument('--parallel', type=int, default=None, help='runs at a time (default 1, or one per GPU)')
  p.add_argument('--gpus', default='', help='comma-separated GPU ids: one run per GPU')


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m analysis.sweep', description=__doc__.split('\n')[0])
  add_run_args(p, 'configs/digits.py:cpu', 'folder holding one workdir per run')
  p.add_argument('--emit-commands', default=None, help=f'command list file (default ROOT/{COMMANDS_FILE})')
  p.add_argument('--emit-slurm', default=None, help=f'SLURM array script (default ROOT/{SLURM_FILE})')
  p.add_argument('--dry-run', action='store_true', help='write the files and show the plan; run nothing')
  return p.parse_args(argv)


def plan(args):
  """Expand the sweep, write the command list and SLURM script; returns (runs, path, arg, root)."""
  remote = '://' in args.root
  root = args.root if remote else os.path.abspath(args.root)
  if remote and not args.dry_run:
    raise ValueError(f'--root={args.root}: bucket roots can only be emitted (add --dry-run and run '
                     'the command list on the hosts); run locally with a local folder')
  runs, path, arg = expand(args.config, root)
  local = '.' if remote else root
  commands_file = os.path.abspath(args.emit_commands or os.path.join(local, COMMANDS_FILE))
  slurm_file = os.path.abspath(args.emit_slurm or os.path.join(local, SLURM_FILE))
  lines = [command_line(command(r, path, arg)) for r in runs]
  write_text(commands_file, '\n'.join(lines) + '\n')
  name = 'sweep-' + os.path.splitext(os.path.basename(path))[0]
  write_text(slurm_file, slurm_script(commands_file, len(runs), root, name))
  print(f'{len(runs)} runs ({len({r.slug for r in runs})} arms) under {root}\n'
        f'commands: {commands_file}\nslurm:    {slurm_file}  (sbatch {slurm_file})')
  return runs, path, arg, root


def main(argv=None):
  """Run the sweep; returns the exit code (1 if any run failed or conflicts, 2 on bad flags)."""
  args = parse_args(argv)
  try:
    gpus = parse_gpus(args.gpus)
    slots = args.parallel or len(gpus) or 1
    if slots < 1:
      raise ValueError(f'--parallel={args.parallel}: give a positive number of runs at a time')
    if gpus and slots > len(gpus):
      raise ValueError(f'--parallel={slots} exceeds the {len(gpus)} GPUs of --gpus; one run per GPU')
    runs, path, arg, root = plan(args)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  module = loader.load_module(path)
  todo, done, failures = [], 0, []
  for run in runs:
    state, detail = saved_state(run, path, arg, module)
    if state == 'completed':
      done += 1
    elif state == 'mismatch':
      failures.append((run, None, detail))
      print(f'FAILED {run.slug}/seed{run.seed}: {detail}')
    else:
      todo.append(run)
      if args.dry_run:
        print(f'would run: {command_line(command(run, path, arg))}' + (f'  # {detail}' if detail else ''))
  print(f'{done} completed (skipped), {len(todo)} to run, {len(failures)} in conflict')
  if args.dry_run:
    return 1 if failures else 0
  progress = Progress(len(runs), done, slots)
  progress.failed = len(failures)
  progress.show()
  try:
    failures += run_all(todo, path, arg, root, progress, slots, gpus)
  except KeyboardInterrupt:
    print('interrupted: running runs stopped; run the same command again to resume', file=sys.stderr)
    return 130
  progress.show('sweep finished')
  for run, code, line in failures:
    print(f'failed: {run.workdir}: ' + (f'exit code {code}, last log line: {line!r}' if code is not None else line))
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
