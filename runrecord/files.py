"""Every write to a path a user names (--out, --emit-*, --readme): one owner, so that no command can
touch a file this project did not write.

  with files.Destination('runs/report', command='analyse', may_write=['report*']) as dest:
    ...                                   # refused before any compute: a user's file in the way
    for path in dest.write(lambda staging: write_everything(staging)): print('wrote', path)

The rules, one place for all of them:
- Written beside the target, then moved into place with `os.replace` (a set of files at once: a
  failure leaves the previous output whole), under a lock (a second writer is refused, one line).
- A symlink is followed: its target is written, the link stays. An existing file keeps its mode.
- A folder's files are the project's when `MANIFEST` (in the folder) lists them with the sha256
  they were written with. A command overwrites or deletes only such files, and deletes only the
  ones it wrote itself (another command's files in a shared --out stay), by names checked to stay
  inside the folder. Any other file in the way is refused before compute, naming it.
"""

import contextlib
import fcntl
import fnmatch
import glob
import hashlib
import json
import os
import shutil
import socket
import stat
import sys
import time
import uuid

MANIFEST = '.tpu-gpu-parity.files.json'  # {name: {'sha256': ..., 'by': command}} per folder
STAGING = '.tpu-gpu-parity.tmp-'


class Busy(ValueError):
  """Another command holds the destination's lock."""


class WriteFailed(ValueError):
  """An OSError while writing (a full disk, permissions): nothing moved into place. Exit 1."""


def sha256(path):
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def inside(home, name):
  """`home`/`name` when `name` is a relative path that stays inside `home`; else None."""
  if not name or os.path.isabs(name) or '\\' in name:
    return None
  path = os.path.normpath(os.path.join(home, name))
  return path if path.startswith(home.rstrip(os.sep) + os.sep) else None


def read_manifest(home):
  """The manifest's entries whose names stay inside `home` (others are ignored, never followed)."""
  try:
    with open(os.path.join(home, MANIFEST), encoding='utf-8') as f:
      entries = json.load(f)
  except (OSError, ValueError):
    return {}
  if not isinstance(entries, dict):
    return {}
  return {
    n: e
    for n, e in entries.items()
    if isinstance(e, dict) and isinstance(e.get('sha256'), str) and inside(home, n)
  }


def is_ours(home, name, manifest):
  """Whether `home`/`name` is a regular file (not a link) this project wrote and nobody changed."""
  path = inside(home, name)
  entry = manifest.get(name)
  if path is None or entry is None or os.path.islink(path) or not os.path.isfile(path):
    return False
  return sha256(path) == entry['sha256']


def _lock(path, flag, target):
  """An exclusive, non-blocking flock on `path`; the fd. Busy when another holds it."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      try:
        with open(path, encoding='utf-8') as f:
          who = json.loads(f.read() or '{}')
      except (OSError, ValueError):
        who = {}
      raise Busy(
        f'{flag} {target}: another command is writing it (pid {who.get("pid", "?")} on '
        f'{who.get("host", "?")}, started {who.get("started", "?")}): wait for it, or give '
        f'another {flag}'
      ) from None
    except OSError as e:  # a file system without locks (ENOLCK on some NFS mounts)
      print(
        f'note: {flag} {target}: cannot lock here ({e.strerror}); written unlocked', file=sys.stderr
      )
    try:
      same = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
      same = False
    if same:
      holder = {'pid': os.getpid(), 'host': socket.gethostname(), 'started': time.strftime('%FT%T')}
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps(holder).encode())
      return fd
    os.close(fd)  # released and unlinked meanwhile: lock the new file


class Destination:
  """One command's output: a folder (`folder=True`) or a file and its companions beside it.

  `command` names the writer in the manifest; `may_write` (names or glob patterns relative to the
  folder) is what it may write, checked on entry so that a user's file in the way is refused
  before any compute; every name is checked again when the files move into place. A file's
  `companions` (e.g. FILE.study.json) belong to it: one this run does not write is removed when
  the project wrote it.
  """

  def __init__(self, target, *, command, folder=True, flag='--out', may_write=(), companions=()):
    if '://' in str(target):
      raise ValueError(f'{flag} {target}: give a local path (buckets are read, not written)')
    given = os.path.abspath(str(target))
    if not folder and os.path.isdir(given):
      raise ValueError(f'{flag} {target} is a folder; give a file name')
    if folder and os.path.exists(given) and not os.path.isdir(given):
      raise ValueError(f'{flag} {target} is a file; give a folder (it is made when missing)')
    self.folder, self.flag, self.command = folder, flag, command
    real = os.path.realpath(given)  # a symlink is followed: its target is what is written
    self.home = real if folder else os.path.dirname(real)
    self.name = None if folder else os.path.basename(real)
    self.may_write = list(may_write)
    self.companions = [] if folder else list(companions)
    self.shown = given
    self.lock_path = os.path.join(self.home, '.tpu-gpu-parity.lock')
    self.created, self._fd, self._staging = [], None, None

  def __enter__(self):
    try:
      missing, path = [], self.home
      while not os.path.lexists(path):
        missing.insert(0, path)
        path = os.path.dirname(path)
      for path in missing:
        os.mkdir(path)
        self.created.append(path)
      self._fd = _lock(self.lock_path, self.flag, self.shown)
      self.refuse_foreign(self._in_the_way(self.may_write))
    except ValueError:
      self.__exit__()
      raise
    except OSError as e:
      self.__exit__()
      raise ValueError(
        f'{self.flag} {self.shown}: cannot write there ({e.strerror}); give a path you can write to'
      ) from None
    return self

  def _in_the_way(self, patterns):
    """What matches `patterns` in the folder (files, links, folders) that this project did not
    write. Exact names are looked up; patterns walk the folder."""
    manifest = read_manifest(self.home)
    if any(glob.has_magic(p) for p in patterns):
      present = []
      for root, dirs, found in os.walk(self.home):
        dirs[:] = [d for d in dirs if not d.startswith(STAGING)]
        present += [os.path.relpath(os.path.join(root, e), self.home) for e in found + dirs]
    else:
      present = [
        p for p in patterns if inside(self.home, p) and os.path.lexists(inside(self.home, p))
      ]
    return sorted(
      n
      for n in present
      if any(fnmatch.fnmatch(n, p) for p in patterns)
      and not (os.path.isdir(inside(self.home, n)) and not os.path.islink(inside(self.home, n)))
      and not is_ours(self.home, n, manifest)
    )

  def refuse_foreign(self, names):
    if names:
      raise ValueError(
        f'{self.flag} {self.shown}: holds files this project did not write (or that were changed '
        f'since): {", ".join(names)}; move them away, or give another {self.flag}'
      )

  def staging(self):
    """A fresh staging folder in the destination's folder (a killed command's old ones removed)."""
    if self._staging is None:
      for name in os.listdir(self.home):
        if name.startswith(STAGING):
          shutil.rmtree(os.path.join(self.home, name), ignore_errors=True)
      self._staging = os.path.join(self.home, f'{STAGING}{os.getpid()}-{uuid.uuid4().hex[:8]}')
      os.mkdir(self._staging)
    return self._staging

  def write(self, write_files):
    """`write_files(staging folder)` -> the staged paths; moved into place together. Returns the
    final paths. Raises ValueError (a foreign file in the way) or WriteFailed (an OSError)."""
    try:
      return self.commit(write_files(self.staging()))
    except OSError as e:
      what = os.strerror(e.errno) if e.errno else str(e)
      where = f' ({e.filename})' if e.filename else ''
      raise WriteFailed(
        f'{self.flag} {self.shown}: could not write ({what}{where}): nothing was moved into '
        'place and what was there is unchanged; free space or fix the folder, then run again'
      ) from e
    finally:
      if self._staging:
        shutil.rmtree(self._staging, ignore_errors=True)
        self._staging = None

  def commit(self, staged):
    names = sorted(os.path.relpath(p, self._staging) for p in staged)
    manifest = read_manifest(self.home)
    for name in names:
      if inside(self.home, name) is None or name == MANIFEST:
        raise ValueError(f'{self.flag}: {name!r} is not a name inside {self.home}')
    self.refuse_foreign(
      [n for n in names if os.path.lexists(self._final(n)) and not self._replaceable(n, manifest)]
    )
    mine = self.companions if not self.folder else list(manifest)
    stale = [
      n
      for n in mine
      if manifest.get(n, {}).get('by') == self.command
      and n not in names
      and is_ours(self.home, n, manifest)
    ]
    for name in names:
      source, final = os.path.join(self._staging, name), self._final(name)
      os.makedirs(os.path.dirname(final), exist_ok=True)
      if os.path.exists(final):
        os.chmod(source, stat.S_IMODE(os.stat(final).st_mode))
      else:
        os.chmod(source, 0o666 & ~_umask())
      os.replace(source, final)
      if self.folder or self.companions:
        manifest[name] = {'sha256': sha256(final), 'by': self.command}
    for name in stale:
      os.remove(os.path.join(self.home, name))
      del manifest[name]
    if self.folder or self.companions:
      self._write_manifest(manifest)
    self.created = []  # written: the folders made for it stay
    return [self._final(n) for n in names]

  def _final(self, name):
    return os.path.join(self.home, name)  # home and a file target's name are the link's target

  def _replaceable(self, name, manifest):
    if not self.folder and name == self.name:
      return os.path.isfile(self._final(name))  # the file the user named: overwritten, as asked
    return is_ours(self.home, name, manifest)

  def _write_manifest(self, manifest):
    path = os.path.join(self.home, MANIFEST)
    if not manifest:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
      return
    tmp = f'{path}.{os.getpid()}'
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(tmp, path)

  def __exit__(self, *exc):
    if self._fd is not None:
      with contextlib.suppress(OSError):
        os.remove(self.lock_path)  # before the unlock: a waiting opener then sees another inode
      os.close(self._fd)
      self._fd = None
    if self._staging:
      shutil.rmtree(self._staging, ignore_errors=True)
      self._staging = None
    for folder in reversed(self.created):  # a command that wrote nothing leaves nothing
      try:
        os.rmdir(folder)
      except OSError:
        break
    self.created = []


def _umask():
  mask = os.umask(0)
  os.umask(mask)
  return mask


def write_file(path, text, *, command, flag='--out'):
  """One text file at a path a user named, by the rules above; its final path."""

  def stage(folder):
    staged = os.path.join(folder, os.path.basename(os.path.realpath(os.path.abspath(path))))
    with open(staged, 'w', encoding='utf-8') as f:
      f.write(text)
    return [staged]

  with Destination(path, command=command, folder=False, flag=flag) as dest:
    return dest.write(stage)[0]
