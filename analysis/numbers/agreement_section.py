"""The agreement part of a study's analysis: every run's saved test predictions read once, then the
churn ladder (analysis/numbers/agreement.py), calibration and training loss
(analysis/numbers/calibration.py), per-class differences (analysis/numbers/per_class.py) and the
variance split (analysis/numbers/variance.py), as DataFrames for CSVs and a one-line summary for the
report's first page (analysis/analyse.py writes the CSVs and the ladder figure).

  section = agreement_section(out.runs, pairs, noise=..., identical=..., platform=...)
  section = from_analysis(out, answer.labels(out))   # an analysis.numbers.result.Analysis: its pairs

Runs whose records hold no predictions (written before runs saved them) are listed in `missing`
and left out; with none at all the summary says "no predictions" and the tables that need them
are empty, while the training-loss table (from the runs table) is still there.
"""

import itertools

import pandas as pd

from analysis.numbers import agreement, agreement_pairs, calibration, per_class, result, variance
from runrecord import predictions, record

def read_run_predictions(run):
  """runrecord/predictions.read_predictions of run folder `run` (its newest step with them), or
  None: a run written before runs saved their predictions."""
  return predictions.read_predictions(run)


def unit_seeds(runs, columns):
  """The model each run is (runrecord.record.model_keys, the replicate rule every reader uses): its
  seed, with its init and data-order seeds where they are set apart from it."""
  seeds = runs['base_seed'] if 'base_seed' in runs else runs['seed']
  return record.model_keys(seeds, *([runs[c] for c in columns] if columns else []))


def load_entries(runs, load=None):
  """([{run, arm, seed, platform, pred, init, data}] of the runs with predictions, [runs
  without]); init and data: the recorded init and data-order seeds (None when not recorded)."""
  load = load or read_run_predictions
  columns = variance.seed_columns(runs)
  preds = [load(run) for run in runs['run']]
  seeds = unit_seeds(runs, columns)
  missing = [run for run, pred in zip(runs['run'], preds) if pred is None]
  entries = []
  for i in (i for i, pred in enumerate(preds) if pred is not None):
    row, pred = runs.iloc[i], preds[i]
    entries.append({'run': row['run'], 'arm': row['arm'], 'seed': seeds[i],
                    'platform': str(row.get('platform', '')), 'pred': pred,
                    'init': row[columns[0]] if columns else None,
                    'data': row[columns[1]] if columns else None})
  return entries, missing


def agreement_section(runs, pairs, noise=(), identical=(), platform=(), load=None, labels=None):
  """The analysis.numbers.result.Agreement of the runs: table (report_agreement.csv), calibration,
  train_loss, per_class, variance (DataFrames); summary (the first-page line); missing (the runs
  without predictions).

  `runs`: completed runs with `run` (the run folder), `arm`, `seed`, `platform` (stats.prepare's
  `runs`); `pairs`: the (a, b) arms compared (declared contrasts, or every pair); `noise`,
  `identical`, `platform`: the ladder's baseline pairs (analysis/numbers/agreement_pairs.py); `load`:
  run folder -> predictions dict or None (default: trainer/predictions.read_predictions);
  `labels`: {arm: short label} for the table's label_a, label_b and the figure (default: the arm)."""
  entries, missing = load_entries(runs, load)
  split, notes = variance.split_by_arm(runs)
  table = agreement.agreement_table(entries, pairs, noise, identical, platform)
  for side in ('a', 'b'):
    table[f'label_{side}'] = [(labels or {}).get(arm, arm) for arm in table[side]]
  return result.Agreement(table=table, summary=agreement.summary(table, len(missing), len(runs)),
                          calibration=calibration.calibration_table(entries),
                          train_loss=calibration.loss_table(runs),
                          per_class=per_class.per_class_table(entries, pairs),
                          variance=split, missing=missing, variance_notes=notes)


def compared_pairs(out):
  """The (a, b) arms the study compares: its declared contrasts, else every pair of arms on one
  platform (pairs across platforms are the ladder's platform rows)."""
  table = out.contrasts
  if table is not None and not table.empty:
    return list(zip(table['arm_a'], table['arm_b']))
  runs = out.runs
  platform = (runs.groupby('arm')['platform'].first().astype(str) if 'platform' in runs else
              pd.Series('', index=sorted(runs['arm'].unique())))
  return [(a, b) for a, b in itertools.combinations(sorted(platform.index), 2)
          if platform[a] == platform[b]]


def from_analysis(out, labels, load=None):
  """agreement_section of analysis/numbers/answer.py's `out`: its compared pairs, the baseline pairs
  agreement_pairs derives from its runs and group-by columns, and `labels` ({arm: short label},
  answer.labels)."""
  runs, group_by = out.runs, out.group_by
  return agreement_section(runs, compared_pairs(out),
                           noise=agreement_pairs.noise_pairs(runs, group_by),
                           identical=agreement_pairs.identical_pairs(runs, group_by),
                           platform=agreement_pairs.platform_pairs(runs, group_by), load=load,
                           labels=labels)
