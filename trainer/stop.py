"""Graceful stop: SIGTERM (a TPU VM preemption, a SLURM time limit, `kill`) and SIGINT (Ctrl-C).

While the training loop runs, the first signal only marks a stop, which the loop reads at every
step boundary: it saves the last step it dispatched and train.py exits with 128 + the signal's
number; a second signal ends the process at once. Outside the loop `exit_at_once` ends it as soon
as Python runs again. Several processes agree on the stop at the loop's sync points (an all-gather
of their marks). `InFlight` keeps the host at most STEPS_IN_FLIGHT steps ahead of the device, which
bounds how late a stop comes. The bound and its measurement: docs/operations.md ("The stop's
bound").
"""

import collections
import os
import signal

# No JAX at import: train.py installs `exit_at_once` before anything heavy is imported.

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Steps the host may dispatch ahead of the device: 2 keeps the next step queued while one runs (no
# idle device between steps: bench_stop_latency.py measures the images/s at 1, 2 and unbounded).
STEPS_IN_FLIGHT = 2


class InFlight:
  """The host's bound on steps dispatched but not done: `dispatched(marker)` after each step (a
  small array the step's output determines and nothing donates: the non-finite watch's) waits
  until the device has finished the step `limit` steps back. `limit` None: no bound (JAX's own
  asynchronous dispatch, for the benchmark's comparison)."""

  def __init__(self, limit):
    self.limit = limit
    self._markers = collections.deque()

  def dispatched(self, marker):
    if self.limit is None:
      return
    self._markers.append(marker)
    while len(self._markers) > self.limit:
      self._markers.popleft().block_until_ready()


class Stopped(Exception):
  """Training stopped on a signal after `step`, whose checkpoint is saved (None: before the first
  step of a fresh run, nothing to save)."""

  def __init__(self, signum, step):
    self.signum, self.step = signum, step
    self.exit_code = 128 + signum
    name = signal.Signals(signum).name
    super().__init__(
      f'{name} received before the first step: nothing to save; run the same command again to start'
      if step is None
      else f'{name} received: stopped after step {step}, whose '
      'checkpoint is saved; run the same command again to resume'
    )


def exit_at_once(signum, frame):
  """Signal handler outside the training loop: one line on stderr, exit 128 + signum now."""
  del frame
  os.write(
    2,
    f'stopped: {signal.Signals(signum).name} received outside the training loop; '
    'nothing new to save: run the same command again to resume\n'.encode(),
  )
  os._exit(128 + signum)


def exit_on_second(signum, frame):
  """Handler after the first signal in the loop: one line on stderr, exit 128 + signum now."""
  del frame
  os.write(
    2,
    f'stopped: a second signal ({signal.Signals(signum).name}) ended the run at once, '
    'without saving this step; the newest finished checkpoint stays valid: run the '
    'same command again to resume\n'.encode(),
  )
  os._exit(128 + signum)


def install(handler):
  """`handler` for SIGTERM and SIGINT (those not ignored); {signal: previous handler}."""
  return {
    sig: signal.signal(sig, handler) for sig in SIGNALS if signal.getsignal(sig) != signal.SIG_IGN
  }


class StopRequests:
  """Context manager: while entered, SIGTERM/SIGINT mark a stop (see the module docstring)."""

  def __init__(self):
    self.signum = None
    self._previous = {}
    self._processes = 1

  def _mark(self, signum, frame):
    del frame
    self.signum = signum
    for sig in SIGNALS:  # a second signal ends the process now, with its line
      signal.signal(sig, exit_on_second)

  def __enter__(self):
    import jax  # (this module imports no JAX)

    self._processes = jax.process_count()
    try:
      self._previous = install(self._mark)
    except ValueError:  # not the main thread: signals stay with whoever handles them there
      self._previous = {}
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def agreed(self, sync_point):
    """The signal number every process stops on after this step, or None to go on.

    One process: whether a signal arrived. Several: at sync points only, the largest signal number
    any process received (an all-gather: every process must call this at the same steps).
    """
    if self._processes == 1:
      return self.signum
    if not sync_point:
      return None
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.int32(self.signum or 0))
    return int(np.max(gathered)) or None
