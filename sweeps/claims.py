"""Which run a sweep starts next when several sweeps share a root: each run is claimed before it
starts (trainer/lock.py `claim`: a non-blocking flock on <run>/sweep.claim, held while its child
runs), so of two sweeps on one root one starts each run, and only it writes the run's log. See
docs/operations.md ("Sweeps and studies").
"""

import os

from analysis.inputs import results
from runrecord import record
from trainer import lock


def saved_results(workdir):
  """(the run's saved results or None, '' or why they cannot be read: the error's type name).
  (None, '') without opening anything when the workdir has no checkpoints folder (a fresh run) or
  is in a bucket (the trainer on the host skips completed ones)."""
  if '://' in workdir or not os.path.isdir(str(record.checkpoint_dir(workdir))):
    return None, ''
  try:
    with results.quiet_absl():
      return record.read_results(workdir), ''
  except Exception as e:  # e.g. a run being written
    return None, type(e).__name__


def says_completed(saved):
  return bool(saved) and saved.get('status') == 'completed'


def completed(run):
  """Whether the run's saved results say 'completed' (False when there are none, or unreadable)."""
  return says_completed(saved_results(run.workdir)[0])


def _try_claim(run, progress, is_completed):
  """(claim, done): this sweep's claim on `run` (lock.claim; None while another process holds
  it), or done=True when the run has been completed elsewhere meanwhile (counted done here)."""
  claim = lock.claim(run.workdir)
  if claim is None or not is_completed(run):
    return claim, False
  lock.release_claim(claim)
  progress.done += 1
  progress.show(
    f'done    {run.slug}/seed{run.seed}: completed elsewhere (another sweep on this root)'
  )
  return None, True


def take(queue, progress, is_completed):
  """(run, claim) of the next run this sweep starts, or (None, None) when none can start now.

  A run another sweep on the same root has claimed is not started here: it waits in
  `progress.elsewhere` until that claim is released, then counts as done if it completed there,
  and is started here (to resume) if not; a queued run completed elsewhere meanwhile counts as
  done too. So of two sweeps on one root, one starts each run, and only it writes the run's log.
  """
  for run in list(progress.elsewhere):
    claim, done = _try_claim(run, progress, is_completed)
    if claim is not None or done:
      progress.elsewhere.remove(run)
    if claim is not None:
      return run, claim
  while queue:
    run = queue.pop(0)
    claim, done = _try_claim(run, progress, is_completed)
    if claim is not None:
      return run, claim
    if not done:
      progress.elsewhere.append(run)
      holder = lock.claimant(run.workdir)
      progress.show(
        f'other   {run.slug}/seed{run.seed}: started by another sweep (pid '
        f'{holder.get("pid", "?")} on {holder.get("host", "?")}); waiting for it'
      )
  return None, None
