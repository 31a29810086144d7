"""Where the analysis commands write (analyse, attribute, draw, export, findings, sweeps.run_study):
every file of one command into a staging folder, moved into place only once all of it is written,
under a lock on the destination. A second command on the same destination is refused in one line
while the first holds it; a failure (a full disk, permissions) leaves the previous report whole.

  with output.Destination(args.out) as dest:     # the lock: ValueError if another command holds it
    out = compute(...)                           # bad input: nothing written, the lock let go
    staged = write_everything(out, dest.staging())
    for path in dest.commit(staged): print(f'wrote {path}')

A folder destination (--out DIR) is locked by DIR/.analysis.lock (DIR is made when missing, and
removed again when the command writes nothing); its staging folder DIR/.analysis-tmp-<pid>-<hex>
is on DIR's own file system, so that the commit is renames only: each file replaces its old version
at once (os.replace), then the files of the previous report this one does not write (listed in
the manifest DIR/.analysis-files.json, written with the rest) are removed: a report is never a mix
of two analyses. A file destination (--out FILE.csv, --readme README.md) is locked by
.FILE.lock beside it and staged in .FILE.tmp-<pid>-<hex>; its companions (FILE.study.json) move
with it. A lock file names its holder (pid, host, start); flock is released by the kernel when the
holder dies (kill -9 included), and a staging folder left by a killed command is removed by the
next one. Bucket destinations (gs://) are not supported by the commands that write.
Reference: docs/statistics.md "Commands".
"""

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
import uuid

LOCK = '.analysis.lock'
MANIFEST = '.analysis-files.json'
STAGING = '.analysis-tmp-'
# What a report folder held before manifests existed: removed when a new report does not write it.
REPORT_NAMES = ('report.md', 'report.tex', 'attribution.md')
REPORT_PREFIXES = ('report_', 'attribution')


class Busy(ValueError):
  """Another command holds the destination's lock."""


class WriteFailed(ValueError):
  """Writing the output failed (a full disk, permissions); the previous output is whole. One line
  (Destination.failure); the commands exit 1 on it."""


def _holder(path):
  try:
    with open(path, encoding='utf-8') as f:
      return json.loads(f.read() or '{}')
  except (OSError, ValueError):
    return {}


def _lock(path, flag, target):
  """An exclusive, non-blocking flock on the lock file `path` (made when missing), checked to be
  the file now at `path` (a holder unlinks it on release); the fd. Busy when another holds it."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      who = _holder(path)
      raise Busy(
        f'{flag} {target}: another analysis is writing it (pid {who.get("pid", "?")} on '
        f'{who.get("host", "?")}, started {who.get("started", "?")}): wait for it to '
        f'finish, or give another {flag}'
      ) from None
    except OSError as e:  # a file system without locks (ENOLCK on some NFS mounts)
      print(
        f'note: {flag} {target}: this file system cannot lock ({e.strerror}): written without '
        'a lock (still staged and moved into place at once)',
        file=sys.stderr,
      )
    try:
      same = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
      same = False
    if same:
      os.ftruncate(fd, 0)
      os.write(
        fd,
        json.dumps(
          {
            'pid': os.getpid(),
            'host': socket.gethostname(),
            'started': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
          }
        ).encode(),
      )
      return fd
    os.close(fd)  # released and unlinked meanwhile: lock the new file


def _missing_parents(path):
  """The folders from the nearest existing ancestor down to `path`, outermost first."""
  missing = []
  while not os.path.lexists(path):
    missing.insert(0, path)
    path = os.path.dirname(path)
  return missing


class Destination:
  """The lock, the staging folder and the commit of one command's output (module doc). `target`:
  the folder (`folder`) or file the command writes; `companions`: further files beside a file
  target that move with it; `flag`: how messages name it."""

  def __init__(self, target, folder=True, flag='--out'):
    if '://' in str(target):
      raise ValueError(
        f'{flag} {target}: write the report to a local folder (a bucket is read, '
        'not written, by the analysis)'
      )
    self.target, self.folder, self.flag = os.path.abspath(str(target)), folder, flag
    self.home = self.target if folder else os.path.dirname(self.target)
    name = os.path.basename(self.target)
    self.lock_path = os.path.join(self.home, LOCK if folder else f'.{name}.lock')
    self.prefix = STAGING if folder else f'.{name}.tmp-'
    self.created, self._fd, self._staging = [], None, None

  def __enter__(self):
    try:
      for path in _missing_parents(self.home):
        os.mkdir(path)
        self.created.append(path)
      self._fd = _lock(self.lock_path, self.flag, self.target)
    except Busy:
      self._undo()
      raise
    except OSError as e:
      self._undo()
      raise ValueError(
        f'{self.flag} {self.target}: cannot write there ({e.strerror}); give a '
        'folder you can write to'
      ) from None
    return self

  def staging(self):
    """The staging folder (made on the first call; a killed command's old ones removed)."""
    if self._staging is None:
      for name in os.listdir(self.home):
        if name.startswith(self.prefix):
          shutil.rmtree(os.path.join(self.home, name), ignore_errors=True)
      self._staging = os.path.join(self.home, f'{self.prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}')
      os.mkdir(self._staging)
    return self._staging

  def final(self, staged):
    """Where the staged file `staged` goes."""
    relative = os.path.relpath(staged, self._staging)
    return os.path.join(self.home, relative)

  def commit(self, staged):
    """Move the staged files (paths in staging()) into place; returns their final paths."""
    staged = list(staged)
    relative = sorted(os.path.relpath(p, self._staging) for p in staged)
    previous = self._previous_files() if self.folder else []
    if self.folder:
      with open(os.path.join(self._staging, MANIFEST), 'w', encoding='utf-8') as f:
        f.write(json.dumps({'files': relative}, indent=1) + '\n')
      staged.append(os.path.join(self._staging, MANIFEST))
    for path in staged:
      os.makedirs(os.path.dirname(self.final(path)), exist_ok=True)
      os.replace(path, self.final(path))
    for name in set(previous) - set(relative):
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(self.home, name))
    shutil.rmtree(self._staging, ignore_errors=True)
    self._staging = None
    self.created = []  # written: what was made stays
    return [self.final_path(r) for r in relative]

  def final_path(self, relative):
    return os.path.join(self.home, relative)

  def _previous_files(self):
    """The files of the report in the folder now: its manifest's, else the report's own names."""
    try:
      with open(os.path.join(self.home, MANIFEST), encoding='utf-8') as f:
        return list(json.loads(f.read())['files'])
    except (OSError, ValueError, KeyError, TypeError):
      return [
        n
        for n in os.listdir(self.home)
        if os.path.isfile(os.path.join(self.home, n))
        and (n in REPORT_NAMES or n.startswith(REPORT_PREFIXES) and n.endswith('.csv'))
      ]

  def write(self, write_files):
    """`write_files(staging folder)` -> the staged paths, then commit them; the final paths. An
    OSError on the way (ENOSPC, EACCES) is a WriteFailed naming it; nothing moved into place."""
    try:
      return self.commit(write_files(self.staging()))
    except OSError as e:
      self._undo()
      raise WriteFailed(self.failure(e)) from None

  def failure(self, error):
    """The one line for a write that failed (a full disk): what failed, and that the previous
    output is whole."""
    what = os.strerror(error.errno) if getattr(error, 'errno', None) else str(error)
    where = f' ({error.filename})' if getattr(error, 'filename', None) else ''
    kept = (
      'the previous report there is unchanged'
      if self.folder
      else f'{os.path.basename(self.target)} is unchanged'
    )
    return (
      f'{self.flag} {self.target}: could not write the output ({what}{where}): nothing was '
      f'moved into place, {kept}; free space or fix the folder, then run the command again'
    )

  def _undo(self):
    """Remove the staging folder and, innermost first, the folders made for the output (while
    empty): a command that wrote nothing leaves nothing."""
    if self._staging:
      shutil.rmtree(self._staging, ignore_errors=True)
      self._staging = None
    for folder in reversed(self.created):
      try:
        os.rmdir(folder)
      except OSError:
        break
    self.created = []

  def __exit__(self, *exc):
    if self._fd is not None:
      with contextlib.suppress(OSError):
        os.remove(self.lock_path)  # before the unlock: a waiting opener then sees another inode
      os.close(self._fd)
      self._fd = None
    self._undo()
