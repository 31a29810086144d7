"""How a sweep's runs are launched: here (train.py children, watched, stopped, claimed once per
shared root) or elsewhere (command list, SLURM script); docs/operations.md ("Sweeps ...")."""

import collections
import contextlib
import dataclasses
import os
import posixpath  # the paths of a root that may be a bucket's (gs://b/study)
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import types
from typing import Any

from runrecord import record
from sweeps import tpu
from trainer import metrics, process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG_FILE = record.LOG_FILE
CACHE_DIR = '.jax_cache'
COMMANDS_FILE = 'sweep_commands.txt'
SLURM_FILE = 'sweep.sbatch'
STOP_GRACE_S = 300
LOCK_WAIT_S = 60
SPEED_WINDOW = 5
GPU_SHARE = 0.9  # of a GPU's memory, split between the runs sharing it (the rest: CUDA contexts)
STEP_COUNTER = re.compile(r'step (\d+)/(\d+)')
# What an `#SBATCH` line may hold: SLURM reads it unquoted (a space ends the value, `%` starts a
# file-name pattern), so user paths there are limited to these characters.
SBATCH_SAFE = re.compile(r'[A-Za-z0-9._/+,:@=-]+')
# Run first in a child: SIGKILL me when my parent (argv[1]) dies (prctl PR_SET_PDEATHSIG = 1; it
# survives the exec), at once if it already has; then exec the run's command (argv[2:]).
DIE_WITH_PARENT = (
  'import ctypes, os, signal, sys; '
  'ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0); '
  'os.getppid() == int(sys.argv[1]) or os.kill(os.getpid(), signal.SIGKILL); '
  'os.execvp(sys.argv[2], sys.argv[2:])'
)


# --- the environment and device of each run ---
def slot_gpus(gpus, slots):
  """[(device, runs on it)] of each of `slots` runs at a time: a GPU id or tpu.Chip each from
  `gpus`, in order; without any, None (every GPU) shared by all."""
  handed = list(gpus)[:slots] if gpus else [None] * slots
  count = collections.Counter(handed)
  return [(gpu, count[gpu]) for gpu in handed]


def memory_fraction(sharing, environ):
  """{'XLA_PYTHON_CLIENT_MEM_FRACTION': GPU_SHARE / sharing} for a run sharing its GPU, else {}."""
  own = any(name in environ for name in process.MEMORY_VARIABLES)  # the user's: left alone
  if sharing <= 1 or own or not process.gpu_runs(environ):
    return {}
  return {'XLA_PYTHON_CLIENT_MEM_FRACTION': f'{GPU_SHARE / sharing:.3f}'}


def child_env(root, gpu=None, sharing=1):
  """A run's environment: the shared compilation cache, its device, its share of a GPU."""
  env = dict(os.environ)
  env.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(root, CACHE_DIR))
  env.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')  # JAX's default: 1 s
  env['PYTHONPATH'] = REPO + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  if isinstance(gpu, tpu.Chip):
    env.update(tpu.environment(gpu.index))
  elif gpu is not None:
    env['CUDA_VISIBLE_DEVICES'] = str(gpu)
  env.update(memory_fraction(sharing, env))
  return env


# --- the command list and the SLURM script: the runs launched elsewhere ---
def flag_value(value):
  """A config value as absl's --config.<field>= parses it back."""
  if isinstance(value, str):
    return value
  return repr(tuple(value) if isinstance(value, list) else value)


def config_flags(run, path, arg):
  """The run's --config flags: the file (relative to the repository root) and its overrides."""
  rel = os.path.relpath(path, REPO)
  config = rel if not rel.startswith('..') else path
  return [f'--config={config}' + (f':{arg}' if arg else '')] + [
    f'--config.{k}={flag_value(v)}' for k, v in run.overrides.items()
  ]


def command(run, path, arg, python='python'):
  """The run's train.py argv, relative to the repository root."""
  flags = config_flags(run, path, arg)
  return [python, 'train.py', flags[0], f'--workdir={run.workdir}', *flags[1:]]


def check_one_line(text, what):
  """A one-line ValueError naming `what` when `text` holds a line break: one run per line."""
  if any(c in text for c in ('\n', '\r', '\0')):
    raise ValueError(
      f'{what}: {text!r} holds a line break, which a command list of one run per '
      'line cannot hold: remove it'
    )


def sbatch_folder(commands_file):
  """The folder of `commands_file` for `#SBATCH --output=`, if SLURM can read it there."""
  folder = os.path.dirname(commands_file)
  bad = sorted({c for c in folder if not SBATCH_SAFE.fullmatch(c)})
  if bad:
    raise ValueError(
      f"--emit-commands={commands_file}: its folder goes into the SLURM script's "
      f'"#SBATCH --output=" line, which SLURM reads without shell quoting, and it '
      f'holds {"".join(bad)!r}: pass --emit-commands (and --emit-slurm) in a folder '
      'named with letters, digits and ._/+,:@=- only'
    )
  return folder


def check_commands(runs, path, arg, root, emitted):
  """Every string of the command list and SLURM script, checked before anything is written."""
  check_one_line(root, '--root')
  check_one_line(path + (arg or ''), '--config')
  for flag, file in zip(('--emit-commands', '--emit-slurm'), emitted, strict=True):
    check_one_line(file, flag)
  sbatch_folder(emitted[0])
  for i, run in enumerate(runs):
    for field, value in run.overrides.items():
      check_one_line(flag_value(value), f'get_sweep() run {i}: {field}')


def slurm_script(commands_file, count, root, job_name, python=sys.executable):
  """A job array of `count` tasks, task i running line i (0-based) of `commands_file` with
  `python` (the interpreter that wrote it, or $SWEEP_PYTHON where the job's environment sets it)."""
  name = re.sub(r'[^A-Za-z0-9._-]+', '-', job_name).strip('-') or 'sweep'
  output = f'{sbatch_folder(commands_file)}/slurm-%A_%a.out'
  return '\n'.join(
    [
      '#!/bin/bash',
      f'#SBATCH --job-name={name}',
      f'#SBATCH --array=0-{count - 1}',
      f'#SBATCH --output={output}',
      '#SBATCH --ntasks=1',
      '# Add resource lines, e.g. #SBATCH --gres=gpu:1. Task i runs line i (0-based) of the list;',
      '# completed runs return at once, unfinished ones resume from their latest checkpoint.',
      'set -euo pipefail',
      f'cd {shlex.quote(REPO)}',
      f'CACHE_DEFAULT={shlex.quote(posixpath.join(root, CACHE_DIR))}',
      'export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$CACHE_DEFAULT}"',
      f'CMD=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(commands_file)})',
      f'PYTHON={shlex.quote(python)}',
      'PYTHON="${SWEEP_PYTHON:-$PYTHON}"',
      'python() { "$PYTHON" "$@"; }  # the lines\' `python`: the interpreter that wrote them',
      'echo "task $SLURM_ARRAY_TASK_ID: $PYTHON ${CMD#python }"',
      'eval "$CMD"',
      '',
    ]
  )


# --- what is read of a run while it trains ---
def tail(path, size=8192):
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, os.path.getsize(path) - size))
      return f.read().decode(errors='replace')
  except OSError:
    return ''


def logged_speeds(workdir):
  """[(step, images/s)] of the training records in the run's metrics.jsonl ([] if unreadable)."""
  from analysis import inputs as results

  try:
    records = results.train_records(workdir)
  except OSError:
    return []
  return [(int(e['step']), float(e['images_per_sec'])) for e in records if e.get('images_per_sec')]


def last_step(workdir):
  records = logged_speeds(workdir)
  return records[-1][0] if records else -1


def speed(workdir, since_step):
  """(images/s or None, last logged step) from the records after `since_step`: the median of the
  last SPEED_WINDOW logged intervals, the first after launch (the compile) left out."""
  records = [r for r in logged_speeds(workdir) if r[0] > since_step]
  measured = [ips for _, ips in records[1:]][-SPEED_WINDOW:]
  last = records[-1][0] if records else since_step
  return (statistics.median(measured) if measured else None), last


def compile_s(workdir, since_step, batch_size):
  """Seconds the logged intervals after `since_step` took beyond the median speed: the compiles."""
  records = [(max(since_step, 0), None)] + [r for r in logged_speeds(workdir) if r[0] > since_step]
  median = statistics.median(ips for _, ips in records[1:]) if records[1:] else None
  return sum(
    (step - prev) * (batch_size or 0) * max(1 / ips - 1 / median, 0.0)
    for (prev, _), (step, ips) in zip(records, records[1:], strict=False)
  )


def saved_results(workdir):
  """(saved results or None, '' or why unreadable); a run without checkpoints: (None, '')."""
  if not os.path.isdir(str(record.checkpoint_dir(workdir))):
    return None, ''
  try:
    with record.orbax_warnings_off():
      return record.read_results(workdir), ''
  except Exception as e:  # e.g. a run being written: relaunched, and it resumes or says why
    return None, type(e).__name__


def completed(run):
  saved = saved_results(run.workdir)[0]
  return bool(saved) and saved.get('status') == 'completed'


# --- claims: which run a sweep starts next when several share a root ---
def try_claim(run, progress, is_completed):
  """(this sweep's claim on `run` or None while another holds it, whether it completed there)."""
  from trainer import checkpoint  # jax and orbax: not for --help

  claim = checkpoint.claim(run.workdir)
  if claim is None or not is_completed(run):
    return claim, False
  checkpoint.release_claim(claim)
  progress.done += 1
  progress.show(
    f'done    {run.slug}/seed{run.seed}: completed elsewhere (another sweep on this root)'
  )
  return None, True


def take(queue, progress, is_completed):
  """(run, claim) of the next run to start, or (None, None): a run another sweep claimed waits in
  `progress.elsewhere` until released, then counts as done or is started here (to resume)."""
  from trainer import checkpoint

  for run in list(progress.elsewhere):
    claim, done = try_claim(run, progress, is_completed)
    if claim is not None or done:
      progress.elsewhere.remove(run)
    if claim is not None:
      return run, claim
  while queue:
    run = queue.pop(0)
    claim, done = try_claim(run, progress, is_completed)
    if claim is not None:
      return run, claim
    if not done:
      progress.elsewhere.append(run)
      holder = checkpoint.claimant(run.workdir)
      progress.show(
        f'other   {run.slug}/seed{run.seed}: started by another sweep (pid '
        f'{holder.get("pid", "?")} on {holder.get("host", "?")}); waiting for it'
      )
  return None, None


# --- launch, watch, stop ---
@dataclasses.dataclass
class Active:
  """A running run and this sweep's claim on its workdir."""

  run: Any
  proc: Any
  log: Any
  gpu: Any
  started: float
  batch_size: Any
  since_step: int
  claim: Any = None

  @property
  def logfile(self):
    return os.path.join(self.run.workdir, LOG_FILE)

  def measure(self, now):
    """(images/s or None, seconds running, seconds left or None)."""
    ips, step = speed(self.run.workdir, self.since_step)
    found = STEP_COUNTER.findall(tail(self.logfile))  # the log's last `step s/T`
    total = int(found[-1][1]) if found else None
    known = ips and total and self.batch_size
    left = max(total - step, 0) * self.batch_size / ips if known else None
    return ips, now - self.started, left


class Progress:
  """The sweep's counts and console lines; `failures`: [(run, exit code, last log line)]; `held`:
  runs another live process holds; `elsewhere`: runs another sweep claimed."""

  def __init__(self, total, done, slots, out=None):
    self.total, self.done, self.slots, self.out = total, done, slots, out
    self.failures, self.held, self.durations, self.active = [], [], [], {}
    self.elsewhere, self.unlaunched = [], set()  # unlaunched: arms none of whose runs started
    self.start = self.last_shown = time.time()

  @property
  def queued(self):
    busy = len(self.failures) + len(self.held) + len(self.active) + len(self.elsewhere)
    return self.total - self.done - busy

  def eta(self, measures):
    """Seconds to the end from [(images/s, running s, left s)] over the slots (docs/operations.md);
    a later seed costs the finished runs' mean less their compiles. None until that is known."""
    known = self.durations or [(r + left,) * 2 for _, r, left in measures if left is not None]
    if not known and (self.queued or any(left is None for *_, left in measures)):
      return None
    cold, warm = (statistics.mean(x) for x in zip(*known, strict=True)) if known else (0.0, 0.0)
    work = sum(left if left is not None else max(cold - r, 0.0) for _, r, left in measures)
    first_seeds = min(len(self.unlaunched), self.queued)
    return (work + first_seeds * cold + (self.queued - first_seeds) * warm) / self.slots

  def line(self, now=None):
    now = now or time.time()
    measures = [a.measure(now) for a in self.active.values()]
    rates = [ips for ips, _, _ in measures if ips]
    speeds = ([f'{sum(rates):,.0f} images/s'] if rates else []) + (
      [f'{len(measures) - len(rates)} starting'] if len(rates) < len(measures) else []
    )
    running = f'{len(measures)} running' + (f' ({", ".join(speeds)})' if speeds else '')
    busy = (f', {len(self.elsewhere)} in another sweep' if self.elsewhere else '') + (
      f', {len(self.held)} in use elsewhere' if self.held else ''
    )
    return (
      f'[sweep] {self.done}/{self.total} done, {running}, {len(self.failures)} failed{busy} | '
      f'elapsed {metrics.duration(now - self.start)} | ETA {metrics.duration(self.eta(measures))}'
    )

  def show(self, message=None):
    self.last_shown = time.time()
    out = self.out or sys.stdout
    if message:
      print(message, file=out)
    print(self.line(), file=out, flush=True)


@contextlib.contextmanager
def stop_signals():
  """SIGTERM/SIGINT while inside (the main thread's): the first sets `.signum`, a later one `.force`
  (no raising: no child is started and then lost between two statements)."""
  stop = types.SimpleNamespace(signum=None, force=False)

  def handle(signum, _frame):
    if stop.signum is None:
      stop.signum = signum
    else:
      stop.force = True

  main = threading.current_thread() is threading.main_thread()
  old = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
  try:
    yield stop
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)


def launch(run, argv, root, gpu, sharing=1, claim=None):
  """An Active: `argv` started for `run`, its output appended to the run's log."""
  os.makedirs(run.workdir, exist_ok=True)
  env = child_env(root, gpu, sharing)
  log = open(os.path.join(run.workdir, LOG_FILE), 'a')
  memory = ' '.join(filter(None, (process.memory_settings(env, ' ', ''), tpu.settings(env))))
  log.write(
    f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")} {memory + " " if memory else ""}{" ".join(argv)}\n'
  )
  log.flush()
  if sys.platform.startswith('linux'):  # through DIE_WITH_PARENT (not a preexec_fn: Python in
    # the forked child is unsafe once JAX's threads run in this process)
    argv = [sys.executable, '-c', DIE_WITH_PARENT, str(os.getpid()), *argv]
  # In its own process group: a terminal's Ctrl-C reaches the sweep alone, which forwards it.
  proc = subprocess.Popen(
    argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0
  )
  size = getattr(run.config, 'batch_size', None)  # the ETA's images per step
  return Active(run, proc, log, gpu, time.time(), size, last_step(run.workdir), claim)


def wait_for_lock(run, progress, stop, poll):
  """True once no live process holds the run's workdir (at most LOCK_WAIT_S), else False."""
  from trainer import checkpoint

  holder, deadline = checkpoint.holder(run.workdir), time.time() + LOCK_WAIT_S
  if holder is not None:
    progress.show(
      f'waiting: {run.workdir} is held by pid {holder.get("pid", "?")} on '
      f'{holder.get("host", "?")} (e.g. a run of a stopped sweep still exiting)'
    )
  while holder is not None and time.time() < deadline and stop.signum is None:
    time.sleep(poll)
    holder = checkpoint.holder(run.workdir)
  return holder is None


def reap(progress, stopping):
  """Collect finished children, print their end; the devices they free."""
  from trainer import checkpoint

  freed = []
  for pid, a in list(progress.active.items()):
    code = a.proc.poll()
    if code is None:
      continue
    del progress.active[pid]
    a.log.close()
    if a.claim is not None:
      checkpoint.release_claim(a.claim)
    freed.append(a.gpu)
    name, took = f'{a.run.slug}/seed{a.run.seed}', metrics.duration(time.time() - a.started)
    if stopping:
      progress.show(f'stopped {name} after {took} (exit code {code}; log: {a.logfile})')
    elif code == 0:
      progress.done += 1
      took_s = time.time() - a.started
      compiling = compile_s(a.run.workdir, a.since_step, a.batch_size)
      progress.durations.append((took_s, took_s - compiling))
      progress.show(f'done    {name} in {took} (log: {a.logfile})')
    else:
      lines = [line.strip() for line in tail(a.logfile).splitlines() if line.strip()]
      line = lines[-1] if lines else ''  # the log's last line
      progress.failures.append((a.run, code, line))
      progress.show(f'FAILED  {name}: exit code {code}, last log line: {line!r} (log: {a.logfile})')
  return freed


def stop_all(progress, stop, poll=0.2):
  """Forward the stop signal (SIGTERM after an error) to every child once, wait, kill leftovers."""
  if not progress.active:
    return
  sig = signal.Signals(stop.signum or signal.SIGTERM)
  for a in progress.active.values():
    a.proc.send_signal(sig)
  progress.show(
    f'stopping: {sig.name} sent to {len(progress.active)} running run(s); waiting for '
    f'them to exit (at most {metrics.duration(STOP_GRACE_S)}; signal again to kill them now)'
  )
  deadline = time.time() + STOP_GRACE_S
  while progress.active:
    if stop.force or time.time() > deadline:
      for a in progress.active.values():
        a.proc.kill()
      for a in progress.active.values():
        a.proc.wait()
    reap(progress, stopping=True)
    time.sleep(poll if progress.active else 0)


def run_all(
  queue, argv_of, root, progress, slots, gpus, poll=0.5, heartbeat=30, is_completed=completed
):
  """Run `queue` in order, `slots` at a time (a device each from `gpus`), each claimed before it
  starts (`take`), `argv_of(run)` its command; (progress.failures, progress.held, stop signal)."""
  from trainer import checkpoint  # jax and orbax: not for --help

  queue, handed = list(queue), slot_gpus(gpus, slots)
  progress.unlaunched = {r.slug for r in queue}
  free, sharing = [gpu for gpu, _ in handed], dict(handed)
  with stop_signals() as stop:
    try:
      while (queue or progress.active or progress.elsewhere) and stop.signum is None:
        while free and stop.signum is None:
          run, claim = take(queue, progress, is_completed)
          if run is None:
            break
          if not wait_for_lock(run, progress, stop, poll):
            checkpoint.release_claim(claim)
            if stop.signum is not None:
              break
            progress.held.append(run)
            progress.show(
              f'in use  {run.slug}/seed{run.seed}: {run.workdir} is still held after '
              f'{metrics.duration(LOCK_WAIT_S)}; not run (rerun when its holder is done)'
            )
            continue
          gpu = free.pop(0)
          a = launch(run, argv_of(run), root, gpu, sharing[gpu], claim)
          progress.active[a.proc.pid] = a
          progress.unlaunched.discard(run.slug)
          on = (
            '' if gpu is None else f' on {gpu}' if isinstance(gpu, tpu.Chip) else f' on GPU {gpu}'
          )
          progress.show(
            f'start   {run.slug}/seed{run.seed}{on}: workdir {run.workdir}, log {a.logfile}'
          )
        time.sleep(poll)
        free += reap(progress, stopping=False)
        if time.time() - progress.last_shown > heartbeat:
          progress.show()
    finally:
      stop_all(progress, stop)
  return progress.failures, progress.held, stop.signum
