"""The workdir a run keeps: made absolute once at the entry point, created, probed writable, and
what it holds checked to be what a run will read and write (trainer/checkpointing.py RUN_FOLDERS,
RUN_FILES; trainer/lock.py FILES) before anything is read or written there. Each failure is a
one-line ConfigError (configs/validation.py); a run refused here leaves nothing behind
(`remove_created`). See docs/operations.md.
"""

import os
import sys
import uuid

from configs.validation import ConfigError
from runrecord import record
from trainer import checkpointing


def absolute_workdir(workdir):
  """Local paths made absolute once, at the entry point (Orbax refuses relative ones); gs:// etc.
  unchanged."""
  return workdir if '://' in workdir else os.path.abspath(os.path.expanduser(workdir))


def check_workdir(workdir, extra_files=()):
  """The workdir must be a folder (or creatable as one) and writable (probed with a temporary
  file), and what a run keeps there (`check_layout`, with `extra_files`) must be what the run will
  read and write.
  Returns the folders it created, outermost first (`remove_created` takes them away again when
  the run is refused before it writes anything)."""
  if not workdir:
    raise ConfigError('--workdir is required')
  check_path_encoding(workdir, '--workdir')
  if '://' in str(workdir):
    return []
  existing = _nearest_existing(workdir)
  if not os.path.isdir(existing):
    where = '' if existing == os.path.abspath(workdir) else f' cannot be created: {existing}'
    raise ConfigError(
      f'--workdir={workdir}{where} is a file, not a folder: choose another '
      'path, or move the file away'
    )
  created = []
  try:
    for folder in _missing_folders(workdir):
      try:
        os.mkdir(folder)
        created.append(folder)
      except FileExistsError:
        if not os.path.isdir(folder):
          raise
        # another process of this run (or a second run started at once) made it first: theirs
    probe = os.path.join(workdir, f'.write_probe_{uuid.uuid4().hex}')
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    remove_created(created)
    raise ConfigError(
      f'--workdir={workdir} is not writable ({e.strerror}): choose another directory'
    ) from None
  try:
    check_layout(workdir, extra_files)
  except ConfigError:
    remove_created(created)
    raise
  return created


def check_path_encoding(path, flag):
  """A path this process can hand to every writer: the file system's encoding (ASCII under a
  non-UTF-8 locale such as LC_ALL=C with Python's UTF-8 mode off) and UTF-8 (what Orbax and
  TensorStore pass to C++) must both spell it; otherwise the first checkpoint, an epoch later,
  fails."""
  try:
    str(path).encode(sys.getfilesystemencoding())
    str(path).encode('utf-8')
  except UnicodeEncodeError:
    raise ConfigError(
      f'{flag}={path!a} holds characters this process cannot pass to the checkpoint writer '
      f'under its locale (file names in {sys.getfilesystemencoding()}): use a UTF-8 locale '
      '(export LC_ALL=C.UTF-8, or PYTHONUTF8=1), or an ASCII path'
    ) from None


def _nearest_existing(path):
  """`path` (absolute) or its closest existing ancestor."""
  path = os.path.abspath(path)
  while not os.path.lexists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def _missing_folders(workdir):
  """The folders from the nearest existing ancestor down to `workdir`, outermost first."""
  path, missing = os.path.abspath(workdir), []
  while not os.path.lexists(path):
    missing.insert(0, path)
    path = os.path.dirname(path)
  return missing


def remove_created(created):
  """Remove the folders check_workdir created (innermost first), each only while empty: a run
  refused before it wrote anything leaves nothing behind."""
  for folder in reversed(created):
    try:
      os.rmdir(folder)
    except OSError:
      return  # not empty (or gone): keep it and everything above


def layout_problem(path, folder):
  """What is wrong with existing `path` for a run that keeps a folder (or a file) there, or None."""
  kinds = ('folder', 'file') if folder else ('file', 'folder')
  if folder != os.path.isdir(path):
    return f'is a {kinds[1]}, not the {kinds[0]} a run keeps there'
  if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
    return 'is not writable'
  return None


def check_layout(workdir, extra_files=()):
  """Every entry of the run layout (trainer/checkpointing.py RUN_FOLDERS, RUN_FILES, the callers'
  `extra_files`: trainer/lock.py FILES, a sweep's train.log; and each step folder under
  checkpoints/) that exists must be the kind of entry the run uses, and writable: one
  line naming the path otherwise, before anything is read or written there (a `checkpoints`
  file would otherwise be found only at the first save, after a fresh start had rewritten the
  metrics)."""
  entries = [(name, True) for name in checkpointing.RUN_FOLDERS]
  entries += [(name, False) for name in checkpointing.RUN_FILES + tuple(extra_files)]
  steps = os.path.join(workdir, record.CHECKPOINTS)
  if os.path.isdir(steps):
    entries += [
      (os.path.join(record.CHECKPOINTS, name), True)
      for name in sorted(os.listdir(steps))
      if name.isdigit()
    ]
  for name, folder in entries:
    path = os.path.join(workdir, name)
    problem = layout_problem(path, folder) if os.path.lexists(path) else None
    if problem:
      raise ConfigError(
        f'--workdir: {path} {problem}: move it out of the workdir (or fix its '
        'permissions), or use another --workdir; nothing was written'
      )
