"""A run's workdir (checked and locked before anything is written) and its Orbax checkpoints: their
writes, what a saved run means for this one, resuming from the newest valid step."""

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import time
import zlib

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from configs.validation import ConfigError
from runrecord import record, rules
from trainer import process

CORRUPT_DIR = 'corrupt_checkpoints'
CLAIM_FILE = 'sweep.claim'
LOCK_FILES = (record.LOCK_FILE, CLAIM_FILE)  # the files of a workdir the lock keeps
# What a run keeps in its workdir, and what each entry must be where it already exists: the
# layout checked before any compute, and what --restart deletes.
RUN_FOLDERS = (record.CHECKPOINTS, record.TENSORBOARD, CORRUPT_DIR)
RUN_FILES = (record.METRICS,)


class CheckpointWriteError(RuntimeError):
  """A checkpoint could not be written (disk full, permissions, ...): one line, for train.py."""


class WorkdirLocked(ConfigError):
  """Another live process holds the workdir."""


def absolute_workdir(workdir):
  """A local path made absolute once, at the entry point (Orbax refuses relative ones)."""
  return workdir if '://' in workdir else os.path.abspath(os.path.expanduser(workdir))


def check_workdir(workdir, extra_files=()):
  """The workdir must be a folder (or creatable), writable, its entries of the kinds a run uses;
  returns the folders it made."""
  if not workdir:
    raise ConfigError('--workdir is required')
  check_path_encoding(workdir, '--workdir')
  if '://' in str(workdir):
    return []
  path, missing = os.path.abspath(workdir), []  # the folders to make, outermost first
  while not os.path.lexists(path):
    missing.insert(0, path)
    path = os.path.dirname(path)
  existing = os.path.dirname(missing[0]) if missing else os.path.abspath(workdir)
  if not os.path.isdir(existing):
    where = f' cannot be created: {existing}' if missing else ''
    raise ConfigError(
      f'--workdir={workdir}{where} is a file, not a folder: choose another '
      'path, or move the file away'
    )
  created = []
  try:
    for folder in missing:
      try:
        os.mkdir(folder)
        created.append(folder)
      except FileExistsError:
        if not os.path.isdir(folder):
          raise
        # another process of this run (or a second run started at once) made it first: theirs
    with tempfile.TemporaryFile(dir=workdir):
      pass  # the write probe
    check_layout(workdir, extra_files)
  except OSError as e:
    remove_created(created)
    raise ConfigError(
      f'--workdir={workdir} is not writable ({e.strerror}): choose another directory'
    ) from e
  except ConfigError:
    remove_created(created)
    raise
  return created


def check_path_encoding(path, flag):
  """A path both the file system's encoding and UTF-8 (what Orbax passes to C++) spell."""
  try:
    str(path).encode(sys.getfilesystemencoding())
    str(path).encode('utf-8')
  except UnicodeEncodeError as e:
    raise ConfigError(
      f'{flag}={path!a} holds characters this process cannot pass to the checkpoint writer '
      f'under its locale (file names in {sys.getfilesystemencoding()}): use a UTF-8 locale '
      '(export LC_ALL=C.UTF-8, or PYTHONUTF8=1), or an ASCII path'
    ) from e


def remove_created(created):
  """Remove the folders check_workdir created (innermost first), each only while empty."""
  for folder in reversed(created):
    try:
      os.rmdir(folder)
    except OSError:
      return  # not empty (or gone): keep it and everything above


def check_layout(workdir, extra_files=()):
  """Each existing entry a run uses (RUN_FOLDERS, RUN_FILES, `extra_files`, step folders) must be of
  its kind and writable: one line naming the path otherwise."""
  entries = [(name, True) for name in RUN_FOLDERS]
  entries += [(name, False) for name in RUN_FILES + tuple(extra_files)]
  steps = os.path.join(workdir, record.CHECKPOINTS)
  if os.path.isdir(steps):
    entries += [
      (os.path.join(record.CHECKPOINTS, name), True)
      for name in sorted(os.listdir(steps))
      if name.isdigit()
    ]
  for name, folder in entries:
    path = os.path.join(workdir, name)
    kinds = ('folder', 'file') if folder else ('file', 'folder')
    problem = None
    if os.path.lexists(path) and folder != os.path.isdir(path):
      problem = f'is a {kinds[1]}, not the {kinds[0]} a run keeps there'
    elif os.path.lexists(path) and not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
      problem = 'is not writable'
    if problem:
      raise ConfigError(
        f'--workdir: {path} {problem}: move it out of the workdir (or fix its '
        'permissions), or use another --workdir; nothing was written'
      )


def _read(path):
  try:
    with open(path) as f:
      return json.loads(f.read() or '{}')
  except (OSError, ValueError):
    return {}


def _probe(path, flags):
  """Whether a shared flock on `path` is refused now (a live holder); None where it cannot lock."""
  try:
    fd = os.open(path, flags)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  except OSError:
    return None
  finally:
    os.close(fd)


def holder(workdir):
  """The record ({'pid', 'host', 'started'}; {} if run.lock is gone) of the live process holding
  `workdir`, or None."""
  path = os.path.join(str(workdir), record.LOCK_FILE)
  held = _probe(str(workdir), os.O_RDONLY | os.O_DIRECTORY)
  if held is None:
    held = _probe(path, os.O_RDONLY)
  return _read(path) if held else None


def _open(path):
  """`path` opened read-write, created where missing: a file descriptor to flock."""
  return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _flock(fd):
  """`fd`, exclusively flocked without blocking; on failure closed and the error raised."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    raise
  return fd


def _unlock(fd):
  """Drop the flock on `fd` and close it (closed even when the unlock fails)."""
  try:
    fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


def _who():
  started = time.strftime('%Y-%m-%dT%H:%M:%S%z')
  return {'pid': os.getpid(), 'host': socket.gethostname(), 'started': started}


def claim(workdir):
  """A sweep's claim of a run: the fd of a flock on `<workdir>/sweep.claim` (None: held)."""
  os.makedirs(str(workdir), exist_ok=True)
  fd = _open(os.path.join(str(workdir), CLAIM_FILE))
  try:
    _flock(fd)
  except OSError:
    return None
  os.ftruncate(fd, 0)
  os.write(fd, json.dumps(_who()).encode())
  return fd


def claimant(workdir):
  """The record ({'pid', 'host', 'started'}) of the process that last claimed `workdir`."""
  return _read(os.path.join(str(workdir), CLAIM_FILE))


release_claim = _unlock


class WorkdirLock:
  """One live run per workdir: an flock on the folder (or run.lock), run.lock naming the holder, a
  dead holder's lock taken over."""

  def __init__(self, workdir, enabled=True):
    self.path = os.path.join(str(workdir), record.LOCK_FILE)
    self.enabled = enabled and '://' not in str(workdir)
    self._fd = None
    self.previous = {}

  def _lock(self):
    folder = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY)
    try:
      return _flock(folder)
    except BlockingIOError:
      raise
    except OSError:  # e.g. EBADF/ENOLCK on NFS: lock the file instead
      return _flock(_open(self.path))

  def acquire(self):
    if not self.enabled:
      return self
    try:
      fd = self._lock()
    except OSError as e:
      held = _read(self.path)
      who = (
        f'pid {held.get("pid", "?")} on {held.get("host", "?")}, started {held.get("started", "?")}'
        if held.get('pid')
        else f'its pid is unknown: {record.LOCK_FILE} was deleted'
      )
      raise WorkdirLocked(
        f'workdir {os.path.dirname(self.path)} is in use by a live run ({who}): wait for it, '
        'stop it, or use another --workdir'
      ) from e
    self.previous = _read(self.path)
    if self.previous.get('pid'):
      logging.warning(
        'Taking over the stale lock of pid %s on %s (that process is gone)',
        self.previous.get('pid'),
        self.previous.get('host'),
      )
    with open(self.path, 'w') as f:
      f.write(json.dumps(_who()))
    self._fd = fd
    return self

  def release(self):
    if self._fd is None:
      return
    with contextlib.suppress(OSError), open(self.path, 'w'):
      pass  # an empty lock file: released cleanly, not stale (unless the workdir is gone)
    fd, self._fd = self._fd, None
    _unlock(fd)

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


def manager(workdir, keep):
  """The run's Orbax manager: asynchronous writes, the newest `keep` steps kept."""
  if jax.default_backend() == 'cpu':
    # CPU "devices" share one host memory: Orbax's replica-parallel save (its default off GPU)
    # would slice each replicated array per device, compiling a program per shape (12 s at the
    # first save of ResNet-18 on 8 CPU devices) to copy the same bytes.
    handler = ocp.type_handlers.ArrayHandler(use_replica_parallel=False)
    with record.orbax_warnings_off():  # its warning of a replaced handler: a second stderr line
      ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, cleanup_tmp_directories=True)
  return ocp.CheckpointManager(
    record.checkpoint_dir(workdir),
    options=options,
    item_names=record.ITEMS + (record.PREDICTIONS_ITEM,),
  )


def _short(error):
  return f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'[:300]


def _write_error(step, error):
  """Naming the strerror behind `error` (its cause chain, or Orbax's `os_error_code`)."""
  seen, why = error, _short(error)
  while seen is not None:
    code = re.search(r"os_error_code='?(\d+)", str(seen))
    if isinstance(seen, OSError) and seen.errno or code:
      why = os.strerror(seen.errno if isinstance(seen, OSError) and seen.errno else int(code[1]))
      break
    seen = seen.__cause__ or seen.__context__
  return CheckpointWriteError(
    f'checkpoint of step {step} could not be written ({why}); the '
    'checkpoints already saved are unchanged: free space or fix the workdir, then run the same '
    'command again to resume'
  )


def wait(mngr, step=None):
  """Wait for pending writes; their failure a CheckpointWriteError naming `step`."""
  pending = mngr.latest_step() if step is None else step
  try:
    mngr.wait_until_finished()
  except Exception as e:
    raise _write_error(pending, e) from e


def close(mngr, quiet=False):
  """Close `mngr`: its failure a CheckpointWriteError, or with `quiet` a warning."""
  pending = mngr.latest_step()
  try:
    mngr.close()
  except Exception as e:
    if not quiet:
      raise _write_error(pending, e) from e
    logging.warning('Closing the checkpoint manager: %s', _short(e))


def save(mngr, step, results, state=None, prediction_items=None):
  """The results (and state, predictions) as step `step`, after the previous write; with a state,
  results['state_digest'] set first."""
  wait(mngr)
  if state is not None:
    results['state_digest'] = state_digest(state)
  try:
    record.save(mngr, step, results, state, record.predictions_save_args(prediction_items))
  except (OSError, ValueError, RuntimeError) as e:  # Orbax's own kinds too
    raise _write_error(step, e) from e


def state_digest(state):
  """A short digest of every leaf's path, dtype, shape and bytes: the same on any platform."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    value = np.ascontiguousarray(jax.device_get(leaf))
    crc = zlib.crc32(value.view(np.uint8).reshape(-1)) if value.size else 0
    digest.update(f'{jax.tree_util.keystr(path)}:{value.dtype}:{value.shape}:{crc};'.encode())
  return digest.hexdigest()[:16]


def abstract(state):
  """ShapeDtypeStructs (with shardings) describing `state`, for restoring into the same layout."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)


def restore(mngr, step, abstract_state):
  """(state, results) at `step`; `abstract_state` gives structure, dtypes and shardings."""
  restored = mngr.restore(step, args=record.restore_args(abstract_state))
  return restored[record.STATE_ITEM], restored[record.RESULTS_ITEM]


def restore_results(mngr, step):
  return mngr.restore(step, args=record.restore_args())[record.RESULTS_ITEM]


def restore_newest_valid(mngr, abstract_state):
  """(step, state, results, bad steps) of the newest step whose items read and whose step
  counter and state digest are as saved; step None when none is."""
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


def wipe(workdir):
  """Delete a previous run's outputs (for --restart)."""
  for name in RUN_FOLDERS + RUN_FILES:
    path = epath.Path(workdir) / name
    path.rmtree() if path.is_dir() else path.unlink(missing_ok=True)


def _reopened(mngr, workdir, keep, change, name):
  """`mngr` closed, `change()` made to the workdir by process 0 while the others wait, reopened."""
  mngr.close()
  process.barrier(f'{name}_read')
  if jax.process_index() == 0:
    change()
  process.barrier(f'{name}_changed')
  return manager(workdir, keep)


def _shown(diffs):
  return '; '.join(diffs[:4]) + (f'; and {len(diffs) - 4} more' if len(diffs) > 4 else '')


def check_workdir_run(
  mngr, workdir, config, restart, data=None, facts=None, allow_layout_change=False
):
  """The manager after what the saved run means for this one: wiped with `restart`, refused if
  failed or not the same run (runrecord/rules.py)."""
  step, saved = None, None  # of the newest step whose results item reads
  for candidate in sorted(mngr.all_steps(), reverse=True):
    try:
      step, saved = candidate, dict(restore_results(mngr, candidate))
      break
    except Exception as e:
      logging.warning('Checkpoint step %d: results unreadable (%s)', candidate, _short(e))
  if restart and mngr.all_steps():
    logging.warning('--restart: discarding the run in %s (latest step %s)', workdir, step)
    return _reopened(mngr, workdir, config.keep_checkpoints, lambda: wipe(workdir), 'restart')
  if saved is None:
    return mngr
  if saved.get('status') == 'failed':
    raise ConfigError(
      f'workdir {workdir} holds a run that failed at step {saved.get("failed_step", step)} '
      f'({saved.get("reason", "no reason recorded")}); pass --restart to discard it and start '
      'over, or use another --workdir'
    )
  diffs = rules.config_differences(saved.get('config'), config.to_dict())
  if diffs:
    raise ConfigError(
      f'workdir {workdir} holds a run with a different config ({_shown(diffs)}): pass --restart '
      'to discard it and start over, or use another --workdir'
    )
  diffs = rules.data_differences(saved.get('data'), data)
  if diffs:
    raise ConfigError(
      f'workdir {workdir} holds a run trained on other data ({_shown(diffs)}): to resume it, '
      'point config.data (manual_dir, tfds_dir, cache_dir) at the data it was trained on; to '
      'train on this data, use another --workdir'
    )
  unfinished = facts and saved.get('status') != 'completed'
  moved = rules.identity_differences(saved, facts) if unfinished else []
  if moved and not allow_layout_change:
    raise ConfigError(
      f'workdir {workdir} holds a run saved at step {step} on another platform identity '
      f'({_shown(moved)}; the analysis groups runs by it): resume it where it ran (the same '
      'XLA_FLAGS and instruction set), or pass --allow_layout_change to continue here as a run '
      f'of its own platform ({rules.platform_identity(saved)}+{rules.platform_identity(facts)})'
    )
  diffs = (rules.layout_differences(saved, facts) if unfinished else []) + moved
  if diffs and not allow_layout_change:
    raise ConfigError(
      f'workdir {workdir} holds a run saved at step {step} on another device layout '
      f'({_shown(diffs)}): resume it on the same devices and processes, or pass '
      '--allow_layout_change to continue on these (the results then record each segment)'
    )
  if diffs:
    logging.warning(
      'Continuing the run of %s on another device layout (%s): the results record each segment',
      workdir,
      _shown(diffs),
    )
  return mngr


def resume(mngr, workdir, abstract_state, keep):
  """(mngr, step, state, saved results) from the newest valid step, newer damaged ones set aside."""
  if not mngr.all_steps():
    return mngr, None, None, None
  step, state, saved, bad = restore_newest_valid(mngr, abstract_state)
  if step is None:
    raise ConfigError(
      f'no checkpoint in {record.checkpoint_dir(workdir)} can be restored (steps '
      f'{sorted(bad)} are damaged): pass --restart to start over, or use another --workdir'
    )
  if bad:
    logging.warning(
      'Resuming from step %d: newer checkpoint steps %s are damaged and are moved to %s/%s',
      step,
      sorted(bad),
      workdir,
      CORRUPT_DIR,
    )
    mngr = _reopened(mngr, workdir, keep, lambda: set_aside(workdir, bad), 'corrupt')
  return mngr, step, state, saved
