"""Read every run's Orbax `results` under a root into pandas tables.

A run is a folder holding `checkpoints/`, an Orbax CheckpointManager directory whose steps hold
the items `state` and `results`; the latest step's `results` JSON is the run's current record.
Every reader takes one root or a list of roots, each a local path or a bucket path (gs://...),
mixed freely: all file access goes through `etils.epath` and Orbax. A run is identified by its
root and its path relative to that root (`run` = ROOT/RELATIVE, as found); a run reached through
two roots (a root given twice, or inside another) is an error, not a replicate.

  runs = load_runs('/tmp/study')                       # one row per run
  runs = load_runs(['gs://bucket/gpu', 'runs/cpu'])    # two platforms' roots, read as one
  runs, hist = load('/tmp/study')                      # and one row per run and evaluated epoch
  steps = load_steps('/tmp/study')                     # one row per run and logged training step
  runs, hist, declared = load_study(['runs/cpu', 'gs://b/gpu'])  # and the study's declaration
"""

import contextlib
import json
import logging

from etils import epath
import pandas as pd

from analysis import declaration
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


def add_runs_argument(parser, required=False):
  """The --runs ROOT [ROOT ...] flag every reader takes (to a parser or a mutually exclusive group)."""
  parser.add_argument('--runs', nargs='+', required=required, metavar='ROOT',
                      help='one or more roots holding the runs (local or gs://, mixed)')


def as_roots(roots):
  """A list of roots from one root (str or path) or several."""
  return [str(roots)] if isinstance(roots, (str, epath.Path)) else [str(r) for r in roots]


def find_all(roots):
  """Every run folder under every root, in root order; a run found twice is a ValueError."""
  found, first = [], {}
  for root in as_roots(roots):
    runs = find_runs(root)
    if not runs:
      raise ValueError(f'--runs: no run (a folder holding {record.CHECKPOINTS}/) under {root}; '
                       'point it at the sweep root or a run workdir')
    for run in runs:
      key = run.rstrip('/')
      if key in first:
        raise ValueError(f'--runs: {run} is under both {first[key]} and {root}; give each root once '
                         '(no root inside another)')
      first[key] = root
    found += runs
  return found


def read_all(roots):
  """[(run path, results dict or None or the Exception raised reading it)] for every run under
  the root(s)."""
  runs = find_all(roots)
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


def load(roots):
  """(runs_frame, histories_frame) for every run under the root(s), each results read once."""
  records = read_all(roots)
  return runs_frame(records), histories_frame(records)


def load_study(roots, study=None, config=None):
  """(runs_frame, histories_frame, declaration) of the runs under the root(s): what analysis.study,
  analysis.figures and sweeps.study analyse. The declaration: `study` (--study: a study.json or a
  config file) when given, else the roots' study.json, else `config`'s get_study() (sweeps.study),
  else none ({})."""
  frame, hist = load(roots)
  if study:
    return frame, hist, declaration.load(study)
  declared = declaration.from_roots(roots)[0]
  return frame, hist, declared or (declaration.from_config(config) if config else {})


def load_runs(roots):
  """One row per run under the root(s) (see runs_frame)."""
  return runs_frame(read_all(roots))


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


def load_steps(roots):
  """One row per run and logged training step under the root(s) (see steps_frame)."""
  return steps_frame(find_all(roots))
