"""Orbax checkpoints of a run: the manager, write failures, waiting, restoring the newest valid
step, setting damaged steps aside.

What a checkpoint holds and where belongs to runrecord/record.py. A step whose restore fails, whose
step counter disagrees or whose state digest (`state_digest`, a CRC-32 of every leaf's bytes)
differs is moved to <workdir>/corrupt_checkpoints/ (`restore_newest_valid`); a failed write is one
CheckpointWriteError naming its step. See docs/operations.md (resuming and stopping).
"""

import contextlib
import hashlib
import os
import re
import shutil
import time
import zlib

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from runrecord import predictions, record
from trainer import writers

CORRUPT_DIR = 'corrupt_checkpoints'
# What a run keeps in its workdir, and what each entry must be where it already exists: the
# layout trainer/workdirs.py checks before any compute, and what --restart deletes.
RUN_FOLDERS = (record.CHECKPOINTS, writers.TENSORBOARD, CORRUPT_DIR)
RUN_FILES = (writers.METRICS,)


class CheckpointWriteError(RuntimeError):
  """A checkpoint could not be written (disk full, permissions, ...): one line, for train.py."""


def manager(workdir, keep, async_save=True):
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep,
    create=True,
    enable_async_checkpointing=async_save,
    cleanup_tmp_directories=True,
  )
  return ocp.CheckpointManager(
    record.checkpoint_dir(workdir), options=options, item_names=record.ITEMS + (predictions.ITEM,)
  )


def _os_error(error):
  """The strerror of the OSError behind `error` (its cause chain, or an errno Orbax names in its
  message: tensorstore reports ENOSPC as `[os_error_code='28']`), or None."""
  seen = error
  while seen is not None:
    if isinstance(seen, OSError) and seen.errno:
      return os.strerror(seen.errno)
    code = re.search(r"os_error_code='?(\d+)", str(seen))
    if code:
      return os.strerror(int(code.group(1)))
    seen = seen.__cause__ or seen.__context__
  return None


def _write_error(step, error):
  detail = _os_error(error) or _short(error)
  return CheckpointWriteError(
    f'checkpoint of step {step} could not be written ({detail}); the '
    'checkpoints already saved are unchanged: free space or fix the '
    'workdir, then run the same command again to resume'
  )


@contextlib.contextmanager
def write_errors(step):
  """Inside: a failing write (OSError, or Orbax's ValueError/RuntimeError) becomes the one
  CheckpointWriteError naming `step`."""
  try:
    yield
  except (OSError, ValueError, RuntimeError) as e:
    raise _write_error(step, e) from e


def wait(mngr, step=None):
  """Block until pending writes are done; their failures become a CheckpointWriteError naming
  `step` (default: the newest step started, i.e. the pending one)."""
  pending = mngr.latest_step() if step is None else step
  try:
    mngr.wait_until_finished()
  except Exception as e:
    raise _write_error(pending, e) from e


def close(mngr, quiet=False):
  """Close `mngr` (it waits for the pending write). Its failure is a CheckpointWriteError, or,
  with `quiet` (another error is already on its way out, often this same one), only logged."""
  pending = mngr.latest_step()
  try:
    mngr.close()
  except Exception as e:
    if not quiet:
      raise _write_error(pending, e) from e
    logging.warning('Closing the checkpoint manager: %s', _short(e))


def state_digest(state):
  """A short hex digest of every leaf of `state`: path, dtype, shape and a CRC-32 of its bytes.

  Computed on the host from the (replicated) arrays; the same state gives the same digest on any
  platform and layout. For ResNet-18's training state (~47M values) see the README.
  """
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    value = np.ascontiguousarray(jax.device_get(leaf))
    crc = zlib.crc32(value.view(np.uint8).reshape(-1)) if value.size else 0
    digest.update(f'{jax.tree_util.keystr(path)}:{value.dtype}:{value.shape}:{crc};'.encode())
  return digest.hexdigest()[:16]


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
    except Exception as e:
      logging.warning('Checkpoint step %d: results unreadable (%s)', step, _short(e))
  return None, None


def _short(error):
  return f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'[:300]


def restore_newest_valid(mngr, abstract_state):
  """(step, state, results, bad_steps) of the newest step that restores completely.

  A step is valid when both items restore, the restored state's step counter equals the step and
  its digest equals the one its results hold (records written before digests existed: not
  checked). Returns step None when no step restores.
  """
  bad = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      state, results = restore(mngr, step, abstract_state)
      counter = int(jax.device_get(state['step']))
      if counter != step:
        raise ValueError(f'state step counter {counter} != checkpoint step {step}')
      saved_digest = results.get('state_digest')
      digest = state_digest(state) if saved_digest else None
      if digest != saved_digest:
        raise ValueError(
          f'state digest {digest} != saved {saved_digest}: its data files changed '
          'after they were written'
        )
      return step, state, dict(results), bad
    except Exception as e:
      logging.warning(
        'Checkpoint step %d cannot be restored (%s); trying an older one', step, _short(e)
      )
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


def wipe(workdir, names=RUN_FOLDERS + RUN_FILES):
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
