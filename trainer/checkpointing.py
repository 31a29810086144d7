"""Orbax checkpoints of a run: writing, waiting, restoring the newest valid step, setting aside.

The layout (which items, where) belongs to trainer/record.py. Every save carries the results as
they stand (status 'running' until the last save, then 'completed' or 'failed').

Orbax writes each step into `<step>.orbax-checkpoint-tmp-*` and renames it when complete, so a
write interrupted by a kill never becomes a step. A finalized step with damaged files is found by
a failing restore (or a restored state whose step counter disagrees): `restore_newest_valid`
walks the steps from newest to oldest and moves the bad ones to <workdir>/corrupt_checkpoints/.
"""

import copy
import os
import shutil
import time

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from trainer import faults, record

CORRUPT_DIR = 'corrupt_checkpoints'


class CheckpointWriteError(RuntimeError):
  """A checkpoint could not be written (disk full, permissions, ...): one line, for train.py."""


def manager(workdir, keep, async_save=True):
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
      cleanup_tmp_directories=True)
  return ocp.CheckpointManager(record.checkpoint_dir(workdir), options=options,
                              item_names=record.ITEMS)


def _write_error(step, error):
  cause = error
  while cause is not None and not isinstance(cause, OSError):
    cause = cause.__cause__ or cause.__context__
  detail = f'{cause.strerror or cause}' if isinstance(cause, OSError) else str(error).splitlines()[0]
  return CheckpointWriteError(f'checkpoint of step {step} could not be written ({detail}); the '
                              'checkpoints already saved are unchanged: free space or fix the '
                              'workdir, then run the same command again to resume')


def save(mngr, step, state, results):
  """Save (asynchronously, where enabled) the state and the results at `step`.

  The results are deep-copied: the caller keeps appending to its dict while the write runs.
  """
  try:
    faults.point('save', step, actions=('enospc',))
    mngr.save(step, args=record.save_args(copy.deepcopy(results), state), force=True)
  except (OSError, ValueError, RuntimeError) as e:  # incl. a failed previous asynchronous write
    raise _write_error(step, e) from e
  faults.point('save', step, actions=('kill',))


def wait(mngr, step=None):
  """Block until pending writes are done; their failures become a CheckpointWriteError."""
  try:
    mngr.wait_until_finished()
  except Exception as e:  # pylint: disable=broad-except
    raise _write_error(step if step is not None else mngr.latest_step(), e) from e


def restore(mngr, step, abstract_state):
  """(state, results) at `step`; `abstract_state` gives structure, dtypes and shardings."""
  restored = mngr.restore(step, args=record.restore_args(abstract_state))
  return restored[record.STATE_ITEM], restored[record.RESULTS_ITEM]


def restore_results(mngr, step):
  return mngr.restore(step, args=record.restore_args())[record.RESULTS_ITEM]


def latest_results(mngr):
  """(step, results) of the newest step whose results item reads, or (None, None)."""
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      return step, dict(restore_results(mngr, step))
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('Checkpoint step %d: results unreadable (%s)', step, _short(e))
  return None, None


def _short(error):
  return f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'[:300]


def restore_newest_valid(mngr, abstract_state):
  """(step, state, results, bad_steps) of the newest step that restores completely.

  A step is valid when both items restore and the restored state's step counter equals the step.
  Returns step None when no step restores.
  """
  bad = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      state, results = restore(mngr, step, abstract_state)
      counter = int(jax.device_get(state['step']))
      if counter != step:
        raise ValueError(f'state step counter {counter} != checkpoint step {step}')
      return step, state, dict(results), bad
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('Checkpoint step %d cannot be restored (%s); trying an older one', step,
                      _short(e))
      bad.append(step)
  return None, None, None, bad


def set_aside(workdir, steps):
  """Move damaged steps out of the manager's folder (kept for inspection, never resumed from)."""
  target = epath.Path(workdir) / CORRUPT_DIR
  target.mkdir(parents=True, exist_ok=True)
  stamp = time.strftime('%Y%m%d-%H%M%S')
  for step in steps:
    src = record.checkpoint_dir(workdir) / str(step)
    if src.exists():
      src.rename(target / f'{step}-{stamp}-{os.getpid()}')


def wipe(workdir, names=(record.CHECKPOINTS, 'metrics.jsonl', 'tensorboard', CORRUPT_DIR)):
  """Delete a previous run's outputs (for --restart)."""
  for name in names:
    path = epath.Path(workdir) / name
    if path.is_dir():
      shutil.rmtree(str(path)) if '://' not in str(path) else path.rmtree()
    elif path.exists():
      path.unlink()


def abstract(state):
  """ShapeDtypeStructs (with shardings) describing `state`, for restoring into the same layout."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
