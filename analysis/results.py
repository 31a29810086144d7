"""Read every run's Orbax `results` under a root into pandas tables.

A run is a folder holding `checkpoints/`, an Orbax CheckpointManager directory whose steps hold
the items `state` and `results`; the latest step's `results` JSON is the run's current record.
The root may be a local path or a bucket path (gs://...): all file access goes through
`etils.epath` and Orbax.

  runs = load_runs('/tmp/study')          # one row per run
  hist = load_histories('/tmp/study')     # one row per run and evaluated epoch
"""

import contextlib
import json
import logging

from etils import epath
import orbax.checkpoint as ocp
import pandas as pd

CHECKPOINTS = 'checkpoints'
RESULTS_ITEM = 'results'
# Columns every run row has, in this order, before the flattened ones.
BASE_COLUMNS = ('run', 'status', 'reason', 'seed', 'platform', 'device_kind', 'num_devices',
                'num_processes', 'step', 'total_steps', 'wall_time_s')
# Parts of a results dict that become columns as `prefix.field...` (nested dicts flattened).
FLATTENED = ('final', 'numerics', 'config', 'data', 'model', 'versions')


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
    if any(c.name == CHECKPOINTS for c in children):
      found.append(folder)
    todo.extend(c for c in children if c.name != CHECKPOINTS)
  return sorted(str(f) for f in found)


def read_results(run):
  """The latest saved step's `results` dict of the run folder `run`, or None if no step is saved."""
  options = ocp.CheckpointManagerOptions(read_only=True)
  with ocp.CheckpointManager(epath.Path(run) / CHECKPOINTS, item_names=('state', RESULTS_ITEM),
                             options=options) as mngr:
    step = mngr.latest_step()
    if step is None:
      return None
    restored = mngr.restore(step, args=ocp.args.Composite(results=ocp.args.JsonRestore()))
  return dict(restored[RESULTS_ITEM])


def flatten(tree, prefix):
  """{'a': {'b': 1}} -> {'prefix.a.b': 1}; lists and tuples become JSON strings (hashable)."""
  out = {}
  for key, value in (tree or {}).items():
    name = f'{prefix}.{key}'
    if isinstance(value, dict):
      out.update(flatten(value, name))
    elif isinstance(value, (list, tuple)):
      out[name] = json.dumps(list(value))
    else:
      out[name] = value
  return out


def run_row(run, results):
  """One table row (dict) for `run` from its results dict (None: nothing saved yet)."""
  if results is None:
    return {'run': run, 'status': 'no_results', 'reason': 'no saved checkpoint step'}
  row = {name: results.get(name) for name in BASE_COLUMNS[1:]}
  row['run'] = run
  if row['seed'] is None:
    row['seed'] = (results.get('config') or {}).get('seed')
  for part in FLATTENED:
    row.update(flatten(results.get(part), part))
  return row


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
    raise ValueError(f'--runs: no run (a folder holding {CHECKPOINTS}/) under {root}; '
                     'point it at the sweep root or a run workdir')
  out = []
  with quiet_absl():
    for run in runs:
      try:
        out.append((run, read_results(run)))
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
      rows.append(run_row(run, results))
  frame = pd.DataFrame(rows)
  for name in BASE_COLUMNS:
    if name not in frame:
      frame[name] = None
  rest = sorted(c for c in frame.columns if c not in BASE_COLUMNS)
  return frame[list(BASE_COLUMNS) + rest].reset_index(drop=True)


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


def save_results(run, results, step=0):
  """Write `results` as a results-only step of run folder `run` (tests; importing outside runs)."""
  with ocp.CheckpointManager(epath.Path(run) / CHECKPOINTS, item_names=('state', RESULTS_ITEM)) as mngr:
    mngr.save(step, args=ocp.args.Composite(results=ocp.args.JsonSave(results)), force=True)
    mngr.wait_until_finished()
