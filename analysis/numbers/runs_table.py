"""The runs table's rows before any statistic (analysis/numbers/stats.py prepare): each run's
status and why it is left out, its recorded determinism, the replicate and unit tables, the model
unit each run is averaged and paired by, and the step of an accuracy's lattice.
Reference: docs/statistics.md "Arms, seeds and replicates".
"""

import numpy as np
import pandas as pd

from runrecord import record, rules


def run_deterministic(platform, value):
  """(True/False/None, why): does a run on `platform` whose recorded GPU determinism is `value`
  repeat bit for bit for its seed? None: not recorded."""
  kind = rules.jax_platform(platform)
  if kind == 'gpu' and value is not None and not pd.isna(value):
    return bool(value), f'{record.DETERMINISM_COLUMN}={bool(value)}'
  if kind in ('tpu', 'cpu'):
    return True, platform
  return None, f'platform {platform}: determinism not recorded'


def run_status(frame):
  """Each run's status ('completed' where the table has no status column)."""
  return frame['status'] if 'status' in frame else pd.Series('completed', index=frame.index)


def status_reasons(frame):
  """Why each run is not completed: 'failed: loss is NaN', 'running: step 3/10' ('' if it is)."""
  reason = frame['reason'] if 'reason' in frame else pd.Series('', index=frame.index)
  progress = (
    f'step {a}/{b}'
    for a, b in zip(
      frame.get('step', [None] * len(frame)),
      frame.get('total_steps', [None] * len(frame)),
      strict=True,
    )
  )
  return [
    f'{s}: {r}' if isinstance(r, str) and r else f'{s}: {p}' if s != 'completed' else ''
    for s, r, p in zip(run_status(frame), reason, progress, strict=True)
  ]


def split_runs(frame, metric):
  """(included runs, excluded table with run/status/reason, metric values of all rows).

  Excluded: runs not completed, and completed runs whose metric is missing or not finite (inf).
  """
  status = run_status(frame)
  values = pd.to_numeric(frame[metric], errors='coerce')
  bad = status.ne('completed') | ~np.isfinite(values)
  why = [
    w
    if s != 'completed'
    else f'no value for {metric}'
    if pd.isna(v)
    else f'{metric} = {v} is not finite'
    for s, w, v in zip(status[bad], status_reasons(frame[bad]), values[bad], strict=True)
  ]
  excluded = pd.DataFrame({'run': frame.loc[bad, 'run'], 'status': status[bad], 'reason': why})
  return frame[~bad].copy(), excluded.reset_index(drop=True), values


def check_some_completed(frame):
  """Raise, listing every run with its reason, when no run of `frame` completed."""
  if run_status(frame).eq('completed').any():
    return
  listed = '; '.join(
    f'{run} ({why})' for run, why in zip(frame['run'], status_reasons(frame), strict=True)
  )
  raise ValueError(
    f'--runs/--csv: none of the {len(frame)} runs is completed, so there is nothing to '
    f'analyse; finish or rerun them: {listed}'
  )


def replicate_table(runs):
  """One row per arm and seed run more than once: the runs, their values, mean and range."""
  columns = ['arm', 'seed', 'n_runs', 'runs', 'values', 'mean', 'range', 'identical']
  repeated = runs[runs.groupby(['arm', 'seed'], sort=False)['value'].transform('size') > 1]
  if repeated.empty:
    return pd.DataFrame(columns=columns)
  repeated = repeated.assign(text=[f'{x:.4g}' for x in repeated['value']])
  table = (
    repeated.groupby(['arm', 'seed'], sort=False)
    .agg(
      n_runs=('run', 'size'),
      runs=('run', ', '.join),
      values=('text', ', '.join),
      mean=('value', 'mean'),
      low=('value', 'min'),
      high=('value', 'max'),
    )
    .reset_index()
  )
  table['range'] = table['high'] - table['low']
  table['identical'] = table['range'] == 0
  return table[columns]


def unit_table(runs):
  """One row per arm and seed (per run when unseeded): arm, seed, value = mean over its runs."""
  key = runs['seed'].where(runs['seeded'], runs['run'])
  units = (
    runs.assign(unit=key)
    .groupby(['arm', 'unit'], sort=False)
    .agg(seed=('seed', 'first'), value=('value', 'mean'), n_runs=('run', 'size'))
    .reset_index()
  )
  return units[['arm', 'seed', 'unit', 'value', 'n_runs']]


def model_units(runs, seed_col):
  """The seed each run is averaged and paired by: runrecord.rules.model_keys of its seed and, for
  the `seed` column, its recorded init and data-order seeds (so runs of one seed that differ in
  either are different models, never replicates); an object column."""
  parts = [runs[c] if seed_col == 'seed' and c in runs else None for c in record.SEED_PARTS]
  keys = rules.model_keys(runs['base_seed'], *parts)
  return pd.Series(keys, index=runs.index, dtype=object)


def lattice(runs, metric, scale):
  """The step of an accuracy measured on one recorded test-set size N (100 / N pp, or 1 / N as a
  fraction), else None: such a metric takes only multiples of the step."""
  if 'acc' not in metric.lower() or 'data.test_size' not in runs:
    return None
  sizes = pd.to_numeric(runs['data.test_size'], errors='coerce').dropna().unique()
  return float(scale / sizes[0]) if len(sizes) == 1 and sizes[0] > 0 else None
