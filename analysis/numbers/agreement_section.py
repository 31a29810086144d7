"""The agreement part of a study's analysis: every run's saved test predictions read once, then the
churn ladder (analysis/numbers/agreement.py), calibration and training loss
(analysis/numbers/calibration.py), per-class differences (analysis/numbers/per_class.py) and the
variance split (analysis/numbers/variance.py), as DataFrames for CSVs and a one-line summary for the
report's first page (analysis/analyse.py writes the CSVs and the ladder figure).

  section = agreement_section(out.runs, pairs, noise=..., identical=..., platform=...)
  section = from_analysis(out, answer.labels(out))  # an analysis.numbers.result.Analysis: its pairs

Each run's predictions are those of the step its results came from (analysis/inputs/
inputs.py read); a run without them there (none saved, none at that step, a damaged item)
is listed in `missing` and left out of these sections only, its reason counted on the first page;
with none at all the summary says so and the tables that need them are empty, while the
training-loss table (from the runs table) is still there.
Reference: docs/statistics.md "Agreement between models".
"""

import collections
import itertools

import pandas as pd

from analysis import inputs
from analysis.numbers import agreement, agreement_pairs, calibration, per_class, result, variance
from runrecord import rules


def loaded(runs, load):
  """[(predictions, None) or (None, why)] of each run of `runs` from `load` (run folder ->
  predictions dict or None; None: no run has any, a CSV)."""
  return [
    (pred, None) if pred is not None else (None, inputs.NONE_SAVED)
    for pred in map(load or (lambda run: None), runs['run'])
  ]


def unit_seeds(runs, columns):
  """The model each run is (runrecord.rules.model_keys, the replicate rule every reader uses): its
  seed, with its init and data-order seeds where they are set apart from it."""
  seeds = runs['base_seed'] if 'base_seed' in runs else runs['seed']
  return rules.model_keys(seeds, *([runs[c] for c in columns] if columns else []))


def load_entries(runs, load=None, read=None):
  """([{run, arm, seed, platform, pred, init, data}] of the runs with predictions, [(run, why) of
  the runs without]); init and data: the recorded init and data-order seeds (None when not
  recorded). `read`: runs table -> [(predictions or None, why)] per row (the commands give
  analysis.inputs.run_predictions.read_runs); else `load`: run folder -> predictions or None;
  neither: no predictions."""
  columns = variance.seed_columns(runs)
  got = read(runs) if read else loaded(runs, load)
  preds = [pred for pred, _ in got]
  missing = [(run, why) for run, (pred, why) in zip(runs['run'], got, strict=True) if pred is None]
  seeds = unit_seeds(runs, columns)
  entries = []
  for i in (i for i, pred in enumerate(preds) if pred is not None):
    row, pred = runs.iloc[i], preds[i]
    entries.append(
      {
        'run': row['run'],
        'arm': row['arm'],
        'seed': seeds[i],
        'platform': str(row.get('platform', '')),
        'pred': pred,
        'init': row[columns[0]] if columns else None,
        'data': row[columns[1]] if columns else None,
      }
    )
  return entries, missing


def summary_line(table, missing, total, left_out=(), labels=None):
  """agreement.summary's first-page line, the runs left out counted by reason (run_predictions)
  and the pairs of runs on different test sets (agreement.left_out_text) counted too."""
  reasons = collections.Counter(inputs.reason_kind(why) for _, why in missing)
  apart = agreement.left_out_text(left_out, labels)
  if not missing or set(reasons) == {inputs.NONE_SAVED}:
    line = agreement.summary(table, len(missing), total)
  elif len(missing) == total:
    counted = ', '.join(f'{n} {why}' for why, n in reasons.most_common())
    return (
      f'Agreement: none of the {total} runs has predictions of the step its results came '
      f'from ({counted}); churn, calibration and per-class need them.'
    )
  else:
    counted = ', '.join(f'{n} {why}' for why, n in reasons.most_common())
    line = (
      agreement.summary(table).rstrip('.') + f'; {len(missing)} of {total} runs left out '
      f'of the agreement, calibration and per-class tables ({counted}).'
    )
  return line[:-1] + f'; {apart}.' if apart else line


def agreement_section(
  runs, pairs, noise=(), identical=(), platform=(), load=None, labels=None, scale=None, read=None
):
  """The analysis.numbers.result.Agreement of the runs: table (report_agreement.csv), calibration,
  train_loss, per_class, variance (DataFrames); summary (the first-page line); missing (the runs
  without predictions).

  `runs`: completed runs with `run` (the run folder), `arm`, `seed`, `platform` (stats.prepare's
  `runs`); `pairs`: the (a, b) arms compared (declared contrasts, or every pair); `noise`,
  `identical`, `platform`: the ladder's baseline pairs (analysis/numbers/agreement_pairs.py);
  `read`, `load`: where the predictions come from (load_entries; neither: none, a CSV);
  `labels`: {arm: short label} for the table's label_a, label_b and the figure (default: the arm);
  `scale`: the accuracy's factor to percent (calibration.loss_table; None: from its values)."""
  entries, missing = load_entries(runs, load, read)
  split, notes = variance.split_by_arm(runs)
  left_out = []  # pairs of runs on different test sets (another split seed): not compared
  table = agreement.agreement_table(entries, pairs, noise, identical, platform, left_out)
  for side in ('a', 'b'):
    table[f'label_{side}'] = [(labels or {}).get(arm, arm) for arm in table[side]]
  return result.Agreement(
    table=table,
    summary=summary_line(table, missing, len(runs), left_out, labels),
    calibration=calibration.calibration_table(entries),
    train_loss=calibration.loss_table(runs, scale=scale),
    per_class=per_class.per_class_table(entries, pairs),
    variance=split,
    missing=[run for run, _ in missing],
    variance_notes=notes,
    left_out=left_out,
  )


def compared_pairs(out):
  """The (a, b) arms the study compares: its declared contrasts, else every pair of arms on one
  platform (pairs across platforms are the ladder's platform rows)."""
  table = out.contrasts
  if table is not None and not table.empty:
    return list(zip(table['arm_a'], table['arm_b'], strict=True))
  runs = out.runs
  platform = (
    runs.groupby('arm')['platform'].first().astype(str)
    if 'platform' in runs
    else pd.Series('', index=sorted(runs['arm'].unique()))
  )
  return [
    (a, b)
    for a, b in itertools.combinations(sorted(platform.index), 2)
    if platform[a] == platform[b]
  ]


def from_analysis(out, labels, load=None, read=None):
  """agreement_section of analysis/numbers/answer.py's `out`: its compared pairs, the baseline pairs
  agreement_pairs derives from its runs and group-by columns, and `labels` ({arm: short label},
  answer.labels); `read`, `load`: its predictions (load_entries)."""
  runs, group_by = out.runs, out.group_by
  return agreement_section(
    runs,
    compared_pairs(out),
    noise=agreement_pairs.noise_pairs(runs, group_by),
    identical=agreement_pairs.identical_pairs(runs, group_by),
    platform=agreement_pairs.platform_pairs(runs, group_by),
    load=load,
    read=read,
    labels=labels,
    scale=out.scale if out.metric == calibration.ACCURACY else None,
  )
