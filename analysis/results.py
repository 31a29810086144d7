"""Read every run's Orbax `results` under a root into pandas tables.

A run is a folder holding `checkpoints/`, an Orbax CheckpointManager directory whose steps hold
the items `state` and `results`; the latest step's `results` JSON is the run's current record.
The root may be a local path or a bucket path (gs://...): all file access goes through
`etils.epath` and Orbax.

  runs = load_runs('/tmp/study')          # one row per run
  hist = load_histories('/tmp/study')     # one row per run and evaluated epoch
  steps = load_steps('/tmp/study')        # one row per run and logged training step
"""

import contextlib
import json
import logging

from etils import epath
import pandas as pd

from trainer import record

# Written by trainer/reporting.py in each run folder: one JSON object per logged step and epoch.
METRICS_FILE = 'metrics.jsonl'
STEP_COLUMNS = ('run', 'step', 'epoch', 'train_loss', 'train_accuracy')


def find_runs(root):
  """Sorted run folders (as strings) under `root`: every folder that holds a `checkpoints/`.

  The search does not descend into a `checkpoints/` folder. `root` itself may be a run.
  """
  root = epath.Path(root)
  if not root.exists():
    raise ValueError(f'--runs: {root} does not exist; give the folder (or gs:// path) holding the runs')
  if not root.is_dir():
    raise ValueError(f'--runs: {root} is not a folder; give the folder holding the runs')
  found, todo = [], [root]
  while todo:
    folder = todo.pop()
    children = [c for c in folder.iterdir() if c.is_dir()]
    if any(c.name == record.CHECKPOINTS for c in children):
      found.append(folder)
    todo.extend(c for c in children if c.name != record.CHECKPOINTS)
  return sorted(str(f) for f in found)


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


def read_all(root):
  """[(run path, results dict or None or the Exception raised reading it)] for every run under root."""
  runs = find_runs(root)
  if not runs:
    raise ValueError(f'--runs: no run (a folder holding {record.CHECKPOINTS}/) under {root}; '
                     'point it at the sweep root or a run workdir')
  out = []
  with quiet_absl():
    for run in runs:
      try:
        out.append((run, record.read_results(run)))
      except Exception as e:  # a corrupt run must not hide the others; it is listed as excluded
        out.append((run, e))
  return out


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
      rows.append({'run': run, 'status': 'unreadable', 'reason': f'{type(results).__name__}: {results}'})
    else:
      rows.append(record.row(run, results))
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


def load(root):
  """(runs_frame, histories_frame) for every run under `root`, each results read once."""
  records = read_all(root)
  return runs_frame(records), histories_frame(records)


def load_runs(root):
  """One row per run under `root` (see runs_frame)."""
  return runs_frame(read_all(root))


def load_histories(root):
  """One row per run and evaluated epoch under `root` (see histories_frame)."""
  return histories_frame(read_all(root))


def train_records(run):
  """The training records ('kind': 'train') of the run folder's metrics.jsonl, in order (dicts);
  none without the file; an unreadable line (a run killed while writing it) is skipped."""
  path = epath.Path(run) / METRICS_FILE
  if not path.exists():
    return
  for line in path.read_text().splitlines():
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
  rows = [{'run': str(run), **{k: entry.get(k) for k in STEP_COLUMNS[1:]}}
          for run in runs for entry in train_records(run)]
  return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def load_steps(root):
  """One row per run and logged training step under `root` (see steps_frame)."""
  return steps_frame(find_runs(root))
