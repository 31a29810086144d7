"""Beyond the mean accuracy: calibration (NLL, ECE) per run and per arm, and the final training
loss per arm beside the accuracy. Numbers only (DataFrames for CSVs).

Per run, from its test predictions (runrecord/predictions.read_predictions):
  NLL = −(1/n) Σ_i log max(p_label(i), ε)          classification; ε = float32 tiny (a 0 stays
                                                    finite)
      = −(1/(40n)) Σ_{i,k} [y log p + (1−y) log(1−p)]   attributes (p = `probability`, clipped
                                                    to [ε, 1−ε]; binary cross-entropy per bit)
  ECE = Σ_b (n_b/n) |acc_b − conf_b|                 ECE_BINS equal-width bins of the confidence
      over [0, 1]: bin b holds the examples with confidence in ((b−1)/B, b/B] (the first bin also
      holds 0); acc_b = their share predicted right, conf_b = their mean confidence, n_b their
      count. Confidence: p_predicted (classification); per bit max(p, 1−p) (attributes).
Per arm: one value per seed (replicates averaged), then the mean with its 95% Student t-interval
over seeds (analysis.numbers.inference.t_ci).
Reference: docs/statistics.md "Agreement between models".
"""

import numpy as np
import pandas as pd

from analysis import stats

ECE_BINS = 15
ECE_NAME = f'ECE, {ECE_BINS} equal-width confidence bins over [0, 1]'
EPS = float(np.finfo(np.float32).tiny)
ACCURACY = 'final.test_accuracy'  # the accuracy loss_table shows beside the loss


def ece(confidence, correct, bins=ECE_BINS):
  """Expected calibration error Σ_b (n_b/n)|acc_b − conf_b| over `bins` equal-width bins of
  `confidence` in [0, 1] (right-closed, the first also holds 0)."""
  confidence = np.ravel(np.asarray(confidence, np.float64))
  correct = np.ravel(np.asarray(correct, np.float64))
  which = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
  n_b = np.bincount(which, minlength=bins)
  acc_sum = np.bincount(which, weights=correct, minlength=bins)
  conf_sum = np.bincount(which, weights=confidence, minlength=bins)
  full = n_b > 0
  gap = np.abs(acc_sum[full] - conf_sum[full]) / n_b[full]
  return float(np.sum(n_b[full] / len(confidence) * gap))


def run_calibration(pred):
  """{'accuracy', 'nll', 'ece'} of one run's predictions (formulas: module doc)."""
  label, predicted = np.asarray(pred['label']), np.asarray(pred['predicted'])
  correct = predicted == label
  if 'probability' in pred:  # the attributes task: 40 binary predictions per image
    p = np.clip(np.asarray(pred['probability'], np.float64), EPS, 1 - EPS)
    y = label.astype(np.float64)
    nll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    confidence = np.maximum(p, 1 - p)
  else:
    nll = -np.mean(np.log(np.maximum(np.asarray(pred['p_label'], np.float64), EPS)))
    confidence = pred['p_predicted']
  return {'accuracy': float(np.mean(correct)), 'nll': float(nll), 'ece': ece(confidence, correct)}


def run_table(entries):
  """One row per run with predictions: run, arm, seed, platform, accuracy_pct, nll, ece_pct."""
  rows = []
  for e in entries:
    c = run_calibration(e['pred'])
    rows.append(
      {
        'run': e['run'],
        'arm': e['arm'],
        'seed': e['seed'],
        'platform': e['platform'],
        'accuracy_pct': 100 * c['accuracy'],
        'nll': c['nll'],
        'ece_pct': 100 * c['ece'],
      }
    )
  return pd.DataFrame(
    rows, columns=['run', 'arm', 'seed', 'platform', 'accuracy_pct', 'nll', 'ece_pct']
  )


def per_arm(frame, columns):
  """Per arm: each of `columns` averaged per seed (replicates), then mean, ci_low, ci_high over
  seeds (95% t) as `<column>`, `<column>_ci_low`, `<column>_ci_high`; `seeds` = their number."""
  units = frame.groupby(['arm', 'seed'], sort=True, dropna=False)[columns].mean().reset_index()
  rows = []
  for arm, group in units.groupby('arm', sort=True):
    row = {'arm': arm, 'seeds': len(group)}
    for col in columns:
      x = group[col].dropna().to_numpy(float)
      low, high = stats.t_ci(x)
      row.update(
        {col: x.mean() if len(x) else np.nan, f'{col}_ci_low': low, f'{col}_ci_high': high}
      )
    rows.append(row)
  return pd.DataFrame(rows)


def calibration_table(entries):
  """Per arm: accuracy_pct, nll and ece_pct (ECE_NAME) with their t-intervals over seeds."""
  runs = run_table(entries)
  table = per_arm(runs, ['accuracy_pct', 'nll', 'ece_pct'])
  if not table.empty:
    table['ece_binning'] = ECE_NAME
  return table


def loss_table(runs, loss='final.train_loss', accuracy=ACCURACY, scale=None):
  """Per arm: the final training loss beside the test accuracy (%), each mean with its t-interval
  over seeds, and the loss relative to the lowest arm's (`train_loss_ratio`: how many times the
  best arm's loss). `runs`: a runs table with `arm`, `seed` and the two columns (stats.prepare's
  `runs`, completed runs only). A table without a loss column gives an empty table. The accuracy
  in percent: times `scale` (the analysis's, when the accuracy is its metric), else times 100 for
  fractions (every value <= 1) and as it is for a column already in percent."""
  if loss not in runs or accuracy not in runs:
    return pd.DataFrame()
  values = pd.to_numeric(runs[accuracy], errors='coerce')
  if scale is None:
    scale = 100.0 if values.abs().max() <= 1 else 1.0
  frame = pd.DataFrame(
    {
      'arm': runs['arm'],
      'seed': runs['seed'],
      'train_loss': pd.to_numeric(runs[loss], errors='coerce'),
      'test_accuracy_pct': scale * values,
    }
  )
  table = per_arm(frame, ['test_accuracy_pct', 'train_loss'])
  table['train_loss_ratio'] = table['train_loss'] / table['train_loss'].min()
  return table
