"""Read every run's Orbax `results` under a root into pandas tables.

A run is a folder holding `checkpoints/`, an Orbax CheckpointManager directory whose steps hold
the items `state` and `results`; the latest step's `results` JSON is the run's current record.
Every reader takes one root or a list of roots, each a local path or a bucket path (gs://...),
mixed freely: all file access goes through `etils.epath` and Orbax. A run is named by its
root and its path relative to that root (`run` = ROOT/RELATIVE, as found) and counted once
however it is reached: a folder is entered once by its identity (a local folder's device and
inode, which a symlink, '..' or a bind mount share: `walk`); a run met under two different roots
(one inside the other) is an error, not a replicate; and a run met in two folders (a copy, a bind
mount the walk cannot see, a root and its backup) is one run by its recorded identity
(runrecord/record.py run_identity: the `run_id` made when it started; a digest of the record for
records written before ids existed): counted once when both records are the same, one line naming
both places when they differ.

  runs = load_runs('/tmp/study')                       # one row per run
  runs = load_runs(['gs://bucket/gpu', 'runs/cpu'])    # two platforms' roots, read as one
  runs, hist = load('/tmp/study')                      # and one row per run and evaluated epoch
  steps = load_steps('/tmp/study')                     # one row per run and logged training step
  runs, hist, declared = load_study(['runs/cpu', 'gs://b/gpu'])  # and the study's declaration
Reference: docs/record.md.
"""

import contextlib
import json
import logging
import os
import posixpath
import sys
from collections.abc import Sequence
from typing import Any, Optional, Union

import pandas as pd
from etils import epath

from analysis.inputs import columns, declaration
from runrecord import record, rules

# Written by trainer/writers.py in each run folder: one JSON object per logged step and epoch.
METRICS_FILE = record.METRICS
STEP_COLUMNS = ('run', 'step', 'epoch', 'train_loss', 'train_accuracy')
# One root of run folders or several (local paths or gs://, mixed): what --runs gives.
Roots = Union[str, epath.Path, Sequence[Union[str, epath.Path]]]


def identity(path):
  """What tells two paths of one folder apart from two folders: a local folder's device and inode
  (shared by its symlinks, '..' spellings and bind mounts; its real path where it cannot be
  stat'ed), a bucket path with its '..' and '//' collapsed."""
  text = str(path)
  scheme, sep, rest = text.partition('://')
  if sep:
    return f'{scheme}://{posixpath.normpath(rest)}'
  try:
    stat = os.stat(text)
  except OSError:
    return os.path.realpath(text)
  return f'inode {stat.st_dev}:{stat.st_ino}'


def open_root(root):
  """`root` as an epath.Path, refused in one line (naming --runs) when it is missing, not a folder,
  or a bucket that cannot be reached (no gcsfs installed, no access)."""
  path = epath.Path(root)
  try:
    exists, is_dir = path.exists(), path.is_dir()
  except ImportError as e:
    raise ValueError(
      f'--runs: {root}: reading a bucket needs a filesystem package ({e}); '
      'pip install gcsfs, or copy the runs to a local folder'
    ) from None
  except Exception as e:  # a bucket backend's own error types
    first = (str(e).strip().splitlines() or [''])[0][:200]
    raise ValueError(
      f'--runs: cannot read {root} ({type(e).__name__}: {first}); check the path '
      'and your access to it'
    ) from None
  if not exists:
    raise ValueError(
      f'--runs: {root} does not exist; give the folder (or gs:// path) holding the runs'
    )
  if not is_dir:
    raise ValueError(f'--runs: {root} is not a folder; give the folder holding the runs')
  return path


def walk(root):
  """(run folders, unreadable folders) under `root`: sorted paths (strings), and sorted (path, the
  OSError listing it raised) pairs. A run folder
  holds a `checkpoints/`; the walk does not descend into one, and `root` itself may be a run.

  Each folder is entered once, by its identity (real path): a symlink loop, or a symlink to a
  folder already walked, adds nothing, so the walk ends after at most one visit per real folder.
  Symlinked folders are walked after every plain one, so a run is named by its plain path when
  it has one. A folder that cannot be listed (PermissionError, ...) is returned as unreadable.
  """
  found, unreadable, seen = [], [], set()
  todo, linked = [open_root(root)], []
  while todo or linked:
    folder = todo.pop() if todo else linked.pop()
    key = identity(folder)
    if key in seen:
      continue
    seen.add(key)
    try:
      children = [c for c in folder.iterdir() if c.is_dir()]
    except OSError as e:
      unreadable.append((str(folder), e))
      continue
    if any(c.name == record.CHECKPOINTS for c in children):
      found.append(str(folder))
    for child in sorted(children, reverse=True):
      if child.name != record.CHECKPOINTS:
        (linked if os.path.islink(str(child)) else todo).append(child)
  return sorted(found), sorted(unreadable, key=lambda item: item[0])


def find_runs(root):
  """Sorted run folders (as strings) under `root` (see walk; unreadable folders left out)."""
  return walk(root)[0]


@contextlib.contextmanager
def quiet_absl():
  """Silence Orbax's per-manager absl warnings (read-only notices) while reading many runs."""
  logger = logging.getLogger('absl')
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def as_roots(roots):
  """A list of roots from one root (str or path) or several."""
  return [str(roots)] if isinstance(roots, (str, epath.Path)) else [str(r) for r in roots]


def find_all(roots, unreadable=None):
  """Every run folder under every root, in root order, each once. A root given twice (by another
  spelling, a symlink, '..') is read once; a run met under two different roots (one inside the
  other, or a symlink between them) is a ValueError naming both places. Folders that cannot be
  listed are appended, with their error, to the list `unreadable` when given."""
  found, first, roots_seen = [], {}, set()
  for root in as_roots(roots):
    if identity(root) in roots_seen:
      continue
    roots_seen.add(identity(root))
    runs, locked = walk(root)
    if not runs and not locked:
      raise ValueError(
        f'--runs: no run (a folder holding {record.CHECKPOINTS}/) under {root}; '
        'point it at the sweep root or a run workdir'
      )
    for run in runs:
      key = identity(run)
      if key in first:
        raise ValueError(
          f'--runs: one run is under both {first[key][1]} (as {first[key][0]}) and '
          f'{root} (as {run}); give each root once, no root inside another and no '
          'symlink from one root into another'
        )
      first[key] = (run, root)
    found += runs
    if unreadable is not None:
      unreadable += locked
  return found


def read_all(roots):
  """[(run path, results dict or None or the Exception raised reading it)] for every run under
  the root(s), each run once (one_per_run); a folder that cannot be listed comes with its error
  (PermissionError, ...), so it is listed as unreadable, not silently left out."""
  locked = []
  runs = find_all(roots, locked)
  out = []
  with quiet_absl():
    for run in runs:
      try:
        out.append((run, record.read_results(run)))
      except Exception as e:  # a corrupt run must not hide the others; it is listed as excluded
        out.append((run, e))
  return one_per_run(out) + locked


def one_per_run(records):
  """`records` ([(run path, results)]) with each run once by its identity (record.run_identity):
  a second folder holding the same record is dropped, with a note on stderr naming both places
  (printed once every record is known to agree); two folders whose records share an id but differ
  are a ValueError naming both (a copy taken at another step, or an id copied by hand: which one
  is the run?)."""
  first, kept, notes = {}, [], []
  for run, results in records:
    key = record.run_identity(results) if isinstance(results, dict) else None
    if key is None or key not in first:
      first.setdefault(key, (run, results))
      kept.append((run, results))
      continue
    other, saved = first[key]
    if json.dumps(saved, sort_keys=True, default=str) != json.dumps(
      results, sort_keys=True, default=str
    ):
      raise ValueError(
        f'--runs: run {key} is at {other} and at {run} with different records '
        f'(step {saved.get("step")}, {saved.get("status")} vs step '
        f'{results.get("step")}, {results.get("status")}): one is a copy of the '
        'other taken at another point; keep the one you mean'
      )
    notes.append(f'note: {run} is the run at {other} (run id {key}, the same record): counted once')
  for note in notes:
    print(note, file=sys.stderr)
  return kept


def runs_frame(records):
  """DataFrame with one row per (run, results) record, in the records' order.

  Columns: `run` (path), `status` ('running'|'completed'|'failed'|'no_results'|'unreadable'),
  `reason`, `seed`, `platform`, `device_kind`, `num_devices`, `num_processes`, `step`,
  `total_steps`, `wall_time_s`, then `final.*` (metrics), `numerics.requested.*`,
  `numerics.effective.*`, `config.*` (every config field, dotted), `data.*`, `model.*` and
  `versions.*`.
  """
  rows = []
  for run, results in records:
    if isinstance(results, Exception):
      rows.append(
        {'run': run, 'status': 'unreadable', 'reason': f'{type(results).__name__}: {results}'}
      )
    else:
      rows.append(rules.row(run, results))
  frame = pd.DataFrame(rows)
  for name in record.BASE_COLUMNS:
    if name not in frame:
      frame[name] = None
  rest = sorted(c for c in frame.columns if c not in record.BASE_COLUMNS)
  return frame[list(record.BASE_COLUMNS) + rest].reset_index(drop=True)


def histories_frame(records):
  """Long DataFrame of per-epoch history: `run` plus each history field (epoch, step,
  test_accuracy, test_loss, train_loss, lr, wall_time), one row per run and evaluated epoch."""
  rows = []
  for run, results in records:
    if isinstance(results, dict):
      rows.extend({'run': run, **entry} for entry in results.get('history') or [])
  return pd.DataFrame(rows) if rows else pd.DataFrame(columns=['run', 'epoch'])


def check_runs(frame):
  """The runs table as the analysis reads it: one test set per data config
  (analysis/inputs/columns.py test_set_problems); a ValueError of one line per problem."""
  lines = columns.test_set_problems(frame)
  if lines:
    raise ValueError('\n'.join(f'--runs: {line}' for line in lines))
  return frame


def load(roots: Roots) -> tuple[pd.DataFrame, pd.DataFrame]:
  """(runs_frame, histories_frame) for every run under the root(s), each results read once, the
  table checked (check_runs)."""
  records = read_all(roots)
  return check_runs(runs_frame(records)), histories_frame(records)


def load_study(
  roots: Roots, study: Optional[str] = None, config: Optional[str] = None
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
  """Everything a study's analysis reads from its run folders (analysis.analyse, analysis.draw,
  sweeps.run_study).

  Args:
    roots: one root or a list of roots holding run folders (local or gs://, mixed).
    study: --study, a study.json or a config file with get_study(); None: the roots' study.json.
    config: a config file whose get_study() declares the study when neither gives one.

  Returns:
    (runs, histories, declaration): the runs table (runs_frame, one row per run, checked by
    check_runs), the per-epoch histories (histories_frame) and the declaration ({} when none),
    checked against the runs (declaration.check_levels, naming where it came from).

  Raises:
    ValueError: one line naming --runs or the declaration's source (no run, a bad level).
  """
  frame, hist = load(roots)
  if study:
    declared, where = declaration.load(study), str(study)
  else:
    declared, where = declaration.from_roots(roots)
    if not declared and config:
      declared, where = declaration.from_config(config), f'{config} get_study()'
  declaration.check_levels(declared, frame, where)
  return frame, hist, declared or {}


def load_runs(roots, checked=True):
  """One row per run under the root(s) (see runs_frame), checked (check_runs) unless not
  `checked` (analysis.export copies the table as it is)."""
  frame = runs_frame(read_all(roots))
  return check_runs(frame) if checked else frame


def train_records(run):
  """The training records ('kind': 'train') of the run folder's metrics.jsonl, in order (dicts);
  none without the file; an unreadable line (a run killed while writing it) is skipped."""
  path = epath.Path(run) / METRICS_FILE
  if not path.exists():
    return
  for line in path.read_bytes().decode('utf-8', 'replace').splitlines():
    try:
      entry = json.loads(line)
    except json.JSONDecodeError:
      continue
    if entry.get('kind') == 'train':
      yield entry


def steps_frame(runs):
  """One row per logged training record (train_records) in each run folder's metrics.jsonl:
  run, step, epoch, train_loss, train_accuracy (loss and accuracy over the steps since the
  previous record). Runs without the file add nothing."""
  rows = [
    {'run': str(run), **{k: entry.get(k) for k in STEP_COLUMNS[1:]}}
    for run in runs
    for entry in train_records(run)
  ]
  return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def load_steps(roots):
  """One row per run and logged training step under the root(s) (see steps_frame)."""
  return steps_frame(find_all(roots))
