"""Running a sweep's train.py processes: launch, watch, stop (the runner of sweeps.sweep).

Each run is one `train.py` child process in its own process group, dying with the sweep on Linux,
its output appended to `<workdir>/train.log`; a stop signal is forwarded once and waited for
(STOP_GRACE_S); sweeps sharing a root claim each run before starting it (`take`); runs sharing a
GPU get a share of its memory, and a `--tpu-chips` slot its chip's libtpu variables
(sweeps/tpu_chips.py). The console's progress line, its images/s and ETA: docs/operations.md
("Sweeps and studies").
"""

import collections
import contextlib
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from runrecord import record
from sweeps import claims, run_logs, tpu_chips
from trainer import gpu_memory, lock, platforms, writers

LOG_FILE = record.LOG_FILE
CACHE_DIR = '.jax_cache'
STOP_GRACE_S = 300
LOCK_WAIT_S = 60
SPEED_WINDOW = 5
GPU_SHARE = 0.9  # of a GPU's memory, split between the runs sharing it (the rest: CUDA contexts)
LINUX = sys.platform.startswith('linux')
# Run first in a child: SIGKILL me when my parent (argv[1]) dies (prctl PR_SET_PDEATHSIG = 1; it
# survives the exec), at once if it already has; then exec the run's command (argv[2:]).
DIE_WITH_PARENT = (
  'import ctypes, os, signal, sys; '
  'ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0); '
  'os.getppid() == int(sys.argv[1]) or os.kill(os.getpid(), signal.SIGKILL); '
  'os.execvp(sys.argv[2], sys.argv[2:])'
)


def slot_gpus(gpus, slots):
  """[(GPU id, runs on that GPU)] of each of `slots` runs at a time: one id each from `gpus`, in
  order; without ids, None (every run sees every GPU) shared by all `slots`. The one rule by which
  run_all and the estimate (slot_envs) hand GPUs to slots. `gpus` may hold TPU chips instead
  (sweeps/tpu_chips.py Chip, never repeated): one chip per slot, handed out the same way."""
  handed = list(gpus)[:slots] if gpus else [None] * slots
  count = collections.Counter(handed)
  return [(gpu, count[gpu]) for gpu in handed]


def runs_per_gpu(gpus, slots):
  """{GPU id: concurrent runs on it} (slot_gpus); {None: slots} without ids."""
  return dict(slot_gpus(gpus, slots))


def memory_fraction(sharing, environ):
  """{'XLA_PYTHON_CLIENT_MEM_FRACTION': GPU_SHARE / sharing} for a run that shares its GPU with
  `sharing` - 1 others, or {} (alone on its GPU, `environ` sets a MEMORY_VARIABLES entry, or the
  run has no GPU: trainer/platforms.gpu_runs)."""
  if (
    sharing <= 1
    or any(name in environ for name in gpu_memory.MEMORY_VARIABLES)
    or not platforms.gpu_runs(environ)
  ):  # no GPU JAX can use: nothing to share
    return {}
  return {'XLA_PYTHON_CLIENT_MEM_FRACTION': f'{GPU_SHARE / sharing:.3f}'}


def child_env(root, repo, gpu=None, sharing=1):
  """The environment of a run: the shared compilation cache (unless set), one GPU when given (or
  one TPU chip, a tpu_chips.Chip: libtpu's per-process variables, tpu_chips.environment), the
  GPU memory fraction of `sharing` concurrent runs on it (memory_fraction)."""
  env = dict(os.environ)
  env.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(root, CACHE_DIR))
  env.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')  # JAX's default: 1 s
  env['PYTHONPATH'] = repo + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  if isinstance(gpu, tpu_chips.Chip):
    env.update(tpu_chips.environment(gpu.index))
  elif gpu is not None:
    env['CUDA_VISIBLE_DEVICES'] = str(gpu)
  env.update(memory_fraction(sharing, env))
  return env


def on_device(gpu):
  """'GPU 0' or 'TPU chip 3': a slot's device, for the console."""
  return str(gpu) if isinstance(gpu, tpu_chips.Chip) else f'GPU {gpu}'


def slot_envs(root, repo, gpus, slots):
  """The environment of each of `slots` runs at a time (child_env), GPUs and memory fractions
  handed out as run_all hands them (slot_gpus): what the sweep's --estimate processes get."""
  return [child_env(root, repo, gpu, sharing) for gpu, sharing in slot_gpus(gpus, slots)]


def popen(argv, cwd, env, log):
  """Start `argv` in its own process group; on Linux through DIE_WITH_PARENT (no preexec_fn: a
  fork that runs Python code in the child is unsafe once JAX's threads run in this process)."""
  if LINUX:
    argv = [sys.executable, '-c', DIE_WITH_PARENT, str(os.getpid()), *argv]
  return subprocess.Popen(
    argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0
  )


def last_step(workdir):
  """The step of the run's last logged training record with a speed, or -1."""
  records = run_logs.logged_speeds(workdir)
  return records[-1][0] if records else -1


def speed(workdir, since_step):
  """(images/s or None, last logged step) from the records after `since_step`: the median of the
  last SPEED_WINDOW logged intervals, the first after launch (the compile) left out."""
  records = [r for r in run_logs.logged_speeds(workdir) if r[0] > since_step]
  measured = [ips for _, ips in records[1:]][-SPEED_WINDOW:]
  return (statistics.median(measured) if measured else None), (
    records[-1][0] if records else since_step
  )


@dataclasses.dataclass
class Active:
  """A running run: its process, log file, GPU, start time, batch size, last step before launch,
  and the claim this sweep holds on its workdir (lock.claim; None in tests that build one)."""

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
    total = run_logs.total_steps(self.logfile)
    left = None
    if ips and total and self.batch_size:
      left = max(total - step, 0) * self.batch_size / ips
    return ips, now - self.started, left


class Progress:
  """Counts of the sweep's runs, the running ones, and the console lines. `failures`: [(run, exit
  code, last log line)]; `held`: runs not run because another live process holds their workdir;
  `elsewhere`: runs claimed by another sweep on the same root, waited for."""

  def __init__(self, total, done, slots, out=None):
    self.total, self.done, self.slots, self.out = total, done, slots, out
    self.failures, self.held, self.durations, self.active = [], [], [], {}
    self.elsewhere = []
    self.start = self.last_shown = time.time()

  @property
  def failed(self):
    return len(self.failures)

  @property
  def in_use(self):
    return len(self.held)

  @property
  def queued(self):
    return (
      self.total - self.done - self.failed - self.in_use - len(self.active) - len(self.elsewhere)
    )

  def eta(self, measures):
    """Seconds until the sweep ends from [(images/s, running s, left s)]: (seconds left of the
    running runs + queued runs x seconds per run) / slots, seconds per run the mean duration of
    the finished runs (else the running runs' elapsed plus left); None until a number exists."""
    finished = [running + left for _, running, left in measures if left is not None]
    per_run = statistics.mean(self.durations or finished) if self.durations or finished else None
    work = 0.0
    for _, running, left in measures:
      if left is None and per_run is None:
        return None
      work += left if left is not None else max(per_run - running, 0.0)
    if self.queued:
      if per_run is None:
        return None
      work += self.queued * per_run
    return work / self.slots

  def line(self, now=None):
    now = now or time.time()
    measures = [a.measure(now) for a in self.active.values()]
    rates = [ips for ips, _, _ in measures if ips]
    speeds = ([f'{sum(rates):,.0f} images/s'] if rates else []) + (
      [f'{len(measures) - len(rates)} starting'] if len(rates) < len(measures) else []
    )
    running = f'{len(measures)} running' + (f' ({", ".join(speeds)})' if speeds else '')
    busy = (f', {len(self.elsewhere)} in another sweep' if self.elsewhere else '') + (
      f', {self.in_use} in use elsewhere' if self.in_use else ''
    )
    return (
      f'[sweep] {self.done}/{self.total} done, {running}, {self.failed} failed{busy} | '
      f'elapsed {writers.duration(now - self.start)} | ETA {writers.duration(self.eta(measures))}'
    )

  def show(self, message=None):
    self.last_shown = time.time()
    out = self.out or sys.stdout
    if message:
      print(message, file=out)
    print(self.line(), file=out, flush=True)


class Stop:
  """SIGTERM/SIGINT while installed: the first sets `signum`, a later one `force` (no raising, so
  no child can be started and then lost between two statements)."""

  def __init__(self):
    self.signum, self.force = None, False

  def handle(self, signum, _frame):
    if self.signum is None:
      self.signum = signum
    else:
      self.force = True

  @contextlib.contextmanager
  def installed(self):
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    old = {s: signal.signal(s, self.handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      yield self
    finally:
      for s, handler in old.items():
        signal.signal(s, handler)


def launch(run, argv, root, repo, gpu, batch_size, sharing=1, claim=None):
  """Start `argv` for `run` (claimed by this sweep: `claim`) with its output appended to the
  run's log, `sharing` runs on its GPU (child_env); returns an Active."""
  os.makedirs(run.workdir, exist_ok=True)
  env = child_env(root, repo, gpu, sharing)
  log = open(os.path.join(run.workdir, LOG_FILE), 'a')
  # The train.log record of the memory settings and the TPU chip ('' if none).
  memory = ' '.join(
    filter(None, (gpu_memory.memory_settings(env, ' ', ''), tpu_chips.settings(env)))
  )
  log.write(
    f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")} {memory + " " if memory else ""}{" ".join(argv)}\n'
  )
  log.flush()
  since = last_step(run.workdir)
  return Active(run, popen(argv, repo, env, log), log, gpu, time.time(), batch_size, since, claim)


def wait_for_lock(run, progress, stop, poll):
  """True once no live process holds the run's workdir (at most LOCK_WAIT_S), else False."""
  holder, deadline = lock.holder(run.workdir), time.time() + LOCK_WAIT_S
  if holder is not None:
    progress.show(
      f'waiting: {run.workdir} is held by pid {holder.get("pid", "?")} on '
      f'{holder.get("host", "?")} (e.g. a run of a stopped sweep still exiting)'
    )
  while holder is not None and time.time() < deadline and stop.signum is None:
    time.sleep(poll)
    holder = lock.holder(run.workdir)
  return holder is None


def reap(progress, stopping):
  """Collect finished children: print their end; returns the GPUs they free."""
  freed = []
  for pid, a in list(progress.active.items()):
    code = a.proc.poll()
    if code is None:
      continue
    del progress.active[pid]
    a.log.close()
    if a.claim is not None:
      lock.release_claim(a.claim)
    freed.append(a.gpu)
    name, took = f'{a.run.slug}/seed{a.run.seed}', writers.duration(time.time() - a.started)
    if stopping:
      progress.show(f'stopped {name} after {took} (exit code {code}; log: {a.logfile})')
    elif code == 0:
      progress.done += 1
      progress.durations.append(time.time() - a.started)
      progress.show(f'done    {name} in {took} (log: {a.logfile})')
    else:
      line = run_logs.last_line(a.logfile)
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
    f'them to exit (at most {writers.duration(STOP_GRACE_S)}; signal again to kill them now)'
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
  queue,
  argv_of,
  root,
  repo,
  progress,
  slots,
  gpus,
  batch_size=None,
  poll=0.5,
  heartbeat=30,
  is_completed=claims.completed,
):
  """Run `queue` (in order), `slots` at a time (one GPU each from `gpus`); each run is claimed
  before it starts (`take`: runs another sweep started are waited for, not started twice).

  `argv_of(run)`: the run's command; `batch_size(run)`: its global batch (for the ETA);
  `is_completed(run)`: whether a run finished by another sweep completed. Returns (failures [(run,
  exit code, last log line)], in-use runs, the stop signal number or None): the lists are
  progress.failures and progress.held.
  """
  queue, stop = list(queue), Stop()
  handed = slot_gpus(gpus, slots)
  free, sharing = [gpu for gpu, _ in handed], dict(handed)
  with stop.installed():
    try:
      while (queue or progress.active or progress.elsewhere) and stop.signum is None:
        while free and stop.signum is None:
          run, claim = claims.take(queue, progress, is_completed)
          if run is None:
            break
          if not wait_for_lock(run, progress, stop, poll):
            lock.release_claim(claim)
            if stop.signum is not None:
              break
            progress.held.append(run)
            progress.show(
              f'in use  {run.slug}/seed{run.seed}: {run.workdir} is still held after '
              f'{writers.duration(LOCK_WAIT_S)}; not run (rerun when its holder is done)'
            )
            continue
          gpu = free.pop(0)
          a = launch(
            run, argv_of(run), root, repo, gpu, batch_size and batch_size(run), sharing[gpu], claim
          )
          progress.active[a.proc.pid] = a
          progress.show(
            f'start   {run.slug}/seed{run.seed}'
            + (f' on {on_device(a.gpu)}' if a.gpu is not None else '')
            + f': workdir {run.workdir}, log {a.logfile}'
          )
        time.sleep(poll)
        free += reap(progress, stopping=False)
        if time.time() - progress.last_shown > heartbeat:
          progress.show()
    finally:
      stop_all(progress, stop)
  return progress.failures, progress.held, stop.signum
