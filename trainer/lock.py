"""One live run per workdir: an `fcntl.flock` on the workdir folder itself (run.lock when a
filesystem cannot lock folders), `<workdir>/run.lock` naming the holder, a dead holder's lock taken
over; and one starter per run among sweeps sharing a root (`claim`: `<workdir>/sweep.claim`). See
docs/operations.md (the workdir lock; "Sweeps and studies").
"""

import fcntl
import json
import os
import socket
import time

from absl import logging

from configs import validation
from runrecord import record

LOCK_FILE = record.LOCK_FILE
CLAIM_FILE = 'sweep.claim'
FILES = (LOCK_FILE, CLAIM_FILE)  # the files of a workdir this module keeps


class WorkdirLocked(validation.ConfigError):
  """Another live process holds the workdir."""


def _read(path):
  try:
    with open(path) as f:
      return json.loads(f.read() or '{}')
  except (OSError, ValueError):
    return {}


def _probe(path, flags):
  """Whether a shared flock on `path` is refused now (a live exclusive holder); None where the
  filesystem cannot lock it. Nothing is written; a shared lock taken is dropped at once."""
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
  """The record ({'pid', 'host', 'started'}, {} if run.lock is gone) of the live process holding
  `workdir`, or None: probed where WorkdirLock locks (the folder, or run.lock where folders cannot
  be locked). Readers (the sweep) ask here instead of re-spelling the lock."""
  path = os.path.join(str(workdir), LOCK_FILE)
  held = _probe(str(workdir), os.O_RDONLY | os.O_DIRECTORY)
  if held is None:
    held = _probe(path, os.O_RDONLY)
  return _read(path) if held else None


def _open(path):
  """`path` opened read-write (created, 0o644, where missing): a file descriptor to flock."""
  return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _flock(fd):
  """`fd`, exclusively flocked without blocking; on failure (BlockingIOError: another process
  holds it; another OSError: the filesystem cannot lock it) `fd` is closed and the error raised."""
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
  return {
    'pid': os.getpid(),
    'host': socket.gethostname(),
    'started': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
  }


def claim(workdir):
  """Claim `workdir` for the run this process is about to start (a sweep, before it launches the
  run's train.py): an exclusive, non-blocking flock on `<workdir>/sweep.claim`, which then names
  this process. Returns the locked file descriptor, held until `release_claim` or this process's
  death (children do not inherit it), or None when another live process holds the claim: of two
  sweeps sharing a root, exactly one starts each run. The run's own WorkdirLock is separate (the
  child takes it)."""
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


def release_claim(fd):
  _unlock(fd)


class WorkdirLock:
  """Context manager: acquire on enter (or raise WorkdirLocked), release on exit."""

  def __init__(self, workdir, enabled=True):
    self.path = os.path.join(str(workdir), LOCK_FILE)
    self.enabled = enabled and '://' not in str(workdir)
    self._fd = None
    self.previous = {}

  def _lock(self):
    """flock the workdir folder (or, where the filesystem cannot, run.lock): the locked fd."""
    folder = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY)
    try:
      return _flock(folder)
    except BlockingIOError:
      raise
    except OSError:  # e.g. EBADF/ENOLCK on NFS: lock the file instead
      pass
    return _flock(_open(self.path))

  def acquire(self):
    if not self.enabled:
      return self
    try:
      fd = self._lock()
    except OSError:
      holder = _read(self.path)
      who = (
        f'pid {holder.get("pid", "?")} on {holder.get("host", "?")}, started '
        f'{holder.get("started", "?")}'
        if holder.get('pid')
        else f'its pid is unknown: {LOCK_FILE} was deleted'
      )
      raise WorkdirLocked(
        f'workdir {os.path.dirname(self.path)} is in use by a live run ({who}): wait for it, '
        'stop it, or use another --workdir'
      ) from None
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
    try:
      with open(self.path, 'w'):
        pass  # an empty lock file: released cleanly, not stale
    except OSError:
      pass  # the workdir is gone: nothing to mark
    try:
      _unlock(self._fd)
    finally:
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
