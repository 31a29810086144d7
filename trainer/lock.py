"""One live run per workdir: an advisory lock file `<workdir>/run.lock` holding pid and hostname.

The lock is an `fcntl.flock` on that file, so the kernel releases it when the holder dies in any way
(kill -9 included): a lock file left by a dead process is stale and the next run takes it over (with
a warning naming the dead holder). A live holder makes the next run refuse with a message naming its
pid and host. Only process 0 of a multi-process job locks. Bucket workdirs (gs://...) are not locked;
on a filesystem shared between hosts the lock is only as good as that filesystem's flock.
"""

import fcntl
import json
import os
import socket
import time

from absl import logging

from trainer import validation

LOCK_FILE = 'run.lock'


class WorkdirLocked(validation.ConfigError):
  """Another live process holds the workdir."""


def _read(path):
  try:
    with open(path) as f:
      return json.loads(f.read() or '{}')
  except (OSError, ValueError):
    return {}


class WorkdirLock:
  """Context manager: acquire on enter (or raise WorkdirLocked), release on exit."""

  def __init__(self, workdir, enabled=True):
    self.path = os.path.join(str(workdir), LOCK_FILE)
    self.enabled = enabled and '://' not in str(workdir)
    self._fd = None
    self.previous = {}

  def acquire(self):
    if not self.enabled:
      return self
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      os.close(fd)
      holder = _read(self.path)
      raise WorkdirLocked(
          f'workdir {os.path.dirname(self.path)} is in use by a live run (pid '
          f'{holder.get("pid", "?")} on {holder.get("host", "?")}, started '
          f'{holder.get("started", "?")}): wait for it, stop it, or use another --workdir'
      ) from None
    self.previous = _read(self.path)
    if self.previous.get('pid'):
      logging.warning('Taking over the stale lock of pid %s on %s (that process is gone)',
                      self.previous.get('pid'), self.previous.get('host'))
    record = {'pid': os.getpid(), 'host': socket.gethostname(),
              'started': time.strftime('%Y-%m-%dT%H:%M:%S%z')}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    self._fd = fd
    return self

  def release(self):
    if self._fd is None:
      return
    try:
      os.ftruncate(self._fd, 0)  # an empty lock file: released cleanly, not stale
      fcntl.flock(self._fd, fcntl.LOCK_UN)
    finally:
      os.close(self._fd)
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
