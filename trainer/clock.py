"""The training clock: images/s and the ETA of a run, apart from what writes them (CLU's
`ReportProgress` in spirit; trainer/writers.py writes), and `heartbeat(what)` for the silences.

Images/s leaves out evaluations, checkpoint saves (`paused()`) and every interval with a compile;
the ETA is the remaining steps times the mean wall time per step over intervals without a compile,
and `ahead` counts the compiles still to come, which it cannot hold. See docs/operations.md ("A
training run").
"""

import contextlib
import sys
import threading
import time

from absl import logging

HEARTBEAT_S = 10.0


def say(line):
  """A progress line on stdout, time-stamped, where absl shows INFO (train.py; not a benchmark
  that silenced the trainer's logs)."""
  if logging.level_info():
    print(f'{time.strftime("%H:%M:%S")} {line}', file=sys.stdout, flush=True)


@contextlib.contextmanager
def heartbeat(what, every_s=HEARTBEAT_S):
  """Print '<what>...' now, '<what>: still running, N s' every `every_s` seconds from a daemon
  thread while the block runs, and '<what>: done in N s' when it ends (on stdout)."""
  start, done = time.time(), threading.Event()
  say(f'{what}...')

  def beat():
    while not done.wait(every_s):
      say(f'{what}: still running, {time.time() - start:.0f} s')

  thread = threading.Thread(target=beat, daemon=True, name='heartbeat')
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
  say(f'{what}: done in {time.time() - start:.1f} s')


class ProgressClock:
  """Throughput and ETA of a run of `total_steps`, timed from `resume_step`."""

  def __init__(self, total_steps, resume_step=0):
    self.total_steps = total_steps
    self._clock = (time.time(), resume_step)  # (time, step) where the current interval began
    self._paused = 0.0  # seconds of the current interval spent evaluating or saving
    self._clean = False  # whether the current interval holds no compile
    self._timed = [0.0, 0]  # seconds and steps of the clean intervals
    self._evaluated = False
    self.ahead = 0  # step functions still to compile (later phases, the first evaluation)

  def compiles_ahead(self, phases):
    """The run has `phases` training phases left to compile, and its first evaluation."""
    self.ahead = phases + 1

  def compiled(self, step):
    """A compile just ended, `step` steps done: the time before now is not step time."""
    self._clock, self._clean, self._paused = (time.time(), step), True, 0.0
    self.ahead = max(self.ahead - 1, 0)

  @property
  def first_evaluation(self):
    """Whether no evaluation has ended yet in this session (the next one compiles its step)."""
    return not self._evaluated

  def evaluated(self, step):
    """An evaluation ended after `step`: the first one compiled, so its time is left out."""
    if not self._evaluated:
      self._evaluated = True
      self.compiled(step)

  @contextlib.contextmanager
  def paused(self):
    """Work that is not training (an evaluation, a checkpoint save): its wall time is left out
    of the images/s of the interval it falls in (the ETA keeps it)."""
    start = time.time()
    try:
      yield
    finally:
      self._paused += time.time() - max(start, self._clock[0])

  def throughput(self, step, batch_size):
    """Training images/s since the previous call (or the last compile), paused time left out,
    and the ETA (None until a step time without compile has been measured)."""
    now = time.time()
    start, start_step = self._clock
    steps, seconds = max(step - start_step, 1), max(now - start, 1e-9)
    training = max(seconds - self._paused, 1e-9)
    if self._clean:
      self._timed[0] += seconds
      self._timed[1] += steps
    self._clock, self._clean, self._paused = (now, step), True, 0.0
    eta = (self.total_steps - step) * self._timed[0] / self._timed[1] if self._timed[1] else None
    return batch_size * steps / training, eta
