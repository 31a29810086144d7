"""Per-class accuracy differences between two arms, paired over seeds, with the family of classes
Holm-adjusted (analysis.numbers.inference.holm, checked against statsmodels multipletests). Numbers
only.

Per run, class c (attributes task: attribute k over all images): acc_c = (1/n_c) Σ_{i: y_i = c}
[ŷ_i = c] (attributes: (1/n) Σ_i [ŷ_ik = y_ik]). Per shared seed s: d_cs = acc_c(A, s) −
acc_c(B, s) (replicates averaged first). Per class: the mean d̄_c over seeds, its 95% t-interval,
and the paired t-test of d̄_c = 0 (t = d̄_c / (sd(d_c)/√m), m − 1 df; scipy ttest_1samp); p-values
Holm-adjusted over the classes (α = 0.05). A class whose differences are all equal has no t-test
(sd 0): when they are all 0 it has no test at all (p NaN, left out of the Holm family); when they
are the same nonzero value in every seed it gets the exact signed-rank test (every sign alike:
p = 2 / 2^m, analysis.numbers.inference.signed_rank), so a difference that never varies reads as
different once m >= 6 seeds, not as "t = inf, p NaN". `test` names the test of each class.
Reference: docs/statistics.md "Agreement between models".
"""

import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import stats
from analysis.inputs import seed_key

COLUMNS = (
  'a',
  'b',
  'class',
  'seeds',
  'diff_pp',
  'ci_low',
  'ci_high',
  't',
  'p',
  'p_holm',
  'different',
  'test',
)
T_TEST, EXACT, NONE = (
  'paired t',
  'exact signed-rank (constant difference)',
  'none (every difference 0)',
)


def class_tests(d):
  """(p, test name) per class (column) of the seeds × classes differences d (module doc)."""
  with warnings.catch_warnings(), np.errstate(invalid='ignore', divide='ignore'):
    warnings.simplefilter('ignore')
    t_p = sps.ttest_1samp(d, 0.0, axis=0).pvalue
  finite = np.all(np.isfinite(d), axis=0)  # a class absent from the test set: NaN, no test
  varies = finite & (np.ptp(np.where(np.isfinite(d), d, 0), axis=0) > 0)
  constant = finite & ~varies & ~np.all(d == 0, axis=0)
  exact = [
    stats.signed_rank(column)[1] if c else np.nan for column, c in zip(d.T, constant, strict=True)
  ]
  p = np.where(varies, t_p, np.where(constant, exact, np.nan))
  test = np.where(varies, T_TEST, np.where(constant, EXACT, NONE))
  return p, test


def class_accuracy(pred):
  """Accuracy per class (classification: over the images of each true class, NaN for a class
  without images) or per attribute (attributes task), as an array."""
  label, predicted = np.asarray(pred['label']), np.asarray(pred['predicted'])
  if label.ndim > 1:
    return np.mean(label == predicted, axis=0)
  classes = max(int(label.max()), int(predicted.max())) + 1
  right = np.bincount(label, weights=(label == predicted), minlength=classes)
  count = np.bincount(label, minlength=classes)
  with np.errstate(invalid='ignore', divide='ignore'):
    return right / count


def seed_accuracies(entries, arm):
  """{seed: per-class accuracy averaged over the arm's replicates of that seed}."""
  by_seed = {}
  for e in entries:
    if e['arm'] == arm:
      by_seed.setdefault(e['seed'], []).append(class_accuracy(e['pred']))
  width = max((len(a) for v in by_seed.values() for a in v), default=0)

  def pad(a):
    return np.pad(a, (0, width - len(a)), constant_values=np.nan)

  return {s: np.mean([pad(a) for a in v], axis=0) for s, v in by_seed.items()}


def class_differences(entries, a, b):
  """One row per class (COLUMNS): A − B in pp over the shared seeds; empty with < 2 shared seeds."""
  acc_a, acc_b = seed_accuracies(entries, a), seed_accuracies(entries, b)
  shared = sorted(set(acc_a) & set(acc_b), key=seed_key)
  if len(shared) < 2:
    return pd.DataFrame(columns=list(COLUMNS))
  width = max(len(acc_a[shared[0]]), len(acc_b[shared[0]]))

  def pad(x):
    return np.pad(x, (0, width - len(x)), constant_values=np.nan)

  d = 100 * np.array([pad(acc_a[s]) - pad(acc_b[s]) for s in shared])  # seeds × classes
  low, high = stats.t_ci(d.T)
  with warnings.catch_warnings(), np.errstate(invalid='ignore', divide='ignore'):
    warnings.simplefilter('ignore')
    t = sps.ttest_1samp(d, 0.0, axis=0).statistic
  p, test = class_tests(d)
  p_holm = stats.holm(p)
  return pd.DataFrame(
    {
      'a': a,
      'b': b,
      'class': np.arange(width),
      'seeds': len(shared),
      'diff_pp': d.mean(axis=0),
      'ci_low': low,
      'ci_high': high,
      't': t,
      'p': p,
      'p_holm': p_holm,
      'different': p_holm < stats.ALPHA,
      'test': test,
    }
  )


def per_class_table(entries, pairs):
  """class_differences of every (a, b) pair given, stacked (Holm within each pair's classes)."""
  tables = [class_differences(entries, a, b) for a, b in pairs]
  tables = [t for t in tables if not t.empty]
  return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=list(COLUMNS))
