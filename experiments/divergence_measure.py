"""What experiments/divergence.py measures between two models, and how it sums up over seeds.

Distances (float64): ||θa-θb||/||θa|| over all parameters and per group (stem, layer1..4, head),
max |θa-θb|, the same for the BatchNorm running statistics, and on logits ||La-Lb||/||La|| plus the
churn: the share of predicted labels that differ (argmax; for multilabel tasks each label's sign,
over images × labels), the one definition of disagreement the analysis's churn uses too
(analysis/numbers/agreement.py churn), not the share of images with any label different.
Over seeds: the mean with the min–max band (and the sd and the 95% Student t-interval of the mean,
analysis/numbers/inference.py). Whole-test-set churn, per pair (per seed): differing labels /
predicted labels with its 95% interval: one label per image, the Wilson score interval over the
images (statsmodels `proportion_confint`, method 'wilson'); several labels per image, the labels
of one image are not independent, so the t-Wilson interval of the mean per-image share over the
images (analysis.numbers.inference.proportion_mean_ci, images as clusters). Across seeds: the mean
of the per-pair rates r_s with the t-Wilson interval over the independent pairs (inside [0, 1];
the t-interval r̄ ± t_{0.975, m−1} sd(r_s)/√m away from the bounds; seeds are the units: pooling the
images of all seeds into one binomial sample ignores the variation between seeds and is too narrow).
Reference: docs/numerics.md "Experiments on the numerics".
"""

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from statsmodels.stats.proportion import proportion_confint

from analysis.numbers import agreement, inference
from models import architecture

GROUPS = ('stem', 'layer1', 'layer2', 'layer3', 'layer4', 'head')
# conv1 -> stem
PART_OF = {name: part for part, names in architecture.PARTS.items() for name in names}
CI_LEVEL, CI_ALPHA = 0.95, 0.05
CI_METHOD = 'wilson'  # statsmodels proportion_confint: the Wilson score interval
CI_NAME = '95% Wilson score interval (multilabel: over images)'
ACROSS_NAME = '95% t-Wilson interval over seeds (independent pairs)'
BAND_NAME = 'min–max over seeds'


def group_curve(group: str) -> Callable[[dict], Any]:
  """The curve of one parameter group: a pair's row -> the group's rel_l2 (None if absent)."""

  def curve(row):
    return row['params']['groups'].get(group, {}).get('rel_l2')

  return curve


# The per-step curves: name -> the value of one pair's row.
CURVES: dict[str, Callable[[dict], Any]] = {
  'params': lambda r: r['params']['rel_l2'],
  **{f'params.{g}': group_curve(g) for g in GROUPS},
  'params.max_abs': lambda r: r['params']['max_abs'],
  'batch_stats': lambda r: r['batch_stats']['rel_l2'],
  'logits': lambda r: r['logits']['rel_l2'],
  'probe_disagreement': lambda r: r['logits']['pred_differs'],
}


def flat(tree):
  """{'layer1.0.conv1.kernel': leaf, ...} in a fixed order."""
  return {
    '.'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def norms(d, a):
  """{'rel_l2': ||d||/||a||, 'diff_norm': ||d||, 'norm_a': ||a||} of float64 vectors."""
  dd, aa = float(d @ d), float(a @ a)
  return {
    'rel_l2': math.sqrt(dd / aa) if aa else (math.inf if dd else 0.0),
    'diff_norm': math.sqrt(dd),
    'norm_a': math.sqrt(aa),
  }


def param_distance(pa, pb):
  """Over all parameters (one concatenated vector) and per group, max |a-b|; float64."""
  a = {k: np.ravel(v).astype(np.float64) for k, v in flat(pa).items()}
  fb = flat(pb)
  d = {k: v - np.ravel(fb[k]).astype(np.float64) for k, v in a.items()}

  def top(key):  # the part a parameter belongs to: conv1.kernel -> stem
    return PART_OF.get(key.split('.')[0], key.split('.')[0])

  def part(values, group):
    return np.concatenate([v for k, v in values.items() if top(k) == group])

  def everything(values):
    return np.concatenate(list(values.values()))

  names = sorted({top(k) for k in a}, key=lambda g: (GROUPS.index(g) if g in GROUPS else 9, g))
  return {
    **norms(everything(d), everything(a)),
    'max_abs': float(np.max(np.abs(everything(d)), initial=0.0)),
    'groups': {g: norms(part(d, g), part(a, g)) for g in names},
  }


def predictions(logits, task):
  """Per-example predictions: the argmax class, or for multilabel each label's sign (bool)."""
  logits = np.asarray(logits)
  return logits > 0 if task == 'multilabel' else np.argmax(logits, axis=-1)


def differs(pred_a, pred_b):
  """Per example: the share of its predicted labels that differ (one label: 0 or 1); their mean is
  the churn (analysis.numbers.agreement.churn)."""
  d = np.asarray(pred_a) != np.asarray(pred_b)
  return d.reshape(d.shape[0], -1).mean(axis=1)


def logit_distance(la, lb, task):
  """||La-Lb||/||La||, max |La-Lb| and the churn (the share of predicted labels that differ)."""
  la, lb = np.asarray(la, np.float64), np.asarray(lb, np.float64)
  d = la - lb
  return {
    'rel_l2': norms(d.ravel(), la.ravel())['rel_l2'],
    'max_abs': float(np.max(np.abs(d))),
    'pred_differs': agreement.churn(predictions(la, task), predictions(lb, task)),
  }


def pair_churn(pred_a, pred_b, seeds):
  """One pair's whole-test-set churn as disagreement() takes it: {'seeds', 'count' (differing
  labels), 'n' (predicted labels), 'labels' (per image)} and, with several labels per image, its
  interval over the images (proportion)."""
  shares = differs(pred_a, pred_b)
  labels = int(np.asarray(pred_a).size // max(len(shares), 1))
  pair = {
    'seeds': seeds,
    'count': int(round(float(shares.sum()) * labels)),
    'n': int(len(shares) * labels),
    'labels': labels,
  }
  if labels > 1:
    pair['ci_low'], pair['ci_high'] = inference.proportion_mean_ci(shares)
  return pair


def band(values):
  """Mean over seeds with its band: min, max, sd (ddof 1) and the 95% t-interval of the mean.

  None where a value is undefined (no values; sd and t-interval of a single value)."""
  x = np.asarray([v for v in values if v is not None], np.float64)
  if not x.size:
    return {
      'n': 0,
      'mean': None,
      'min': None,
      'max': None,
      'sd': None,
      't_low': None,
      't_high': None,
    }
  low, high = inference.t_ci(x, CI_LEVEL)

  def finite(value):
    return float(value) if np.isfinite(value) else None

  return {
    'n': int(x.size),
    'mean': float(x.mean()),
    'min': float(x.min()),
    'max': float(x.max()),
    'sd': finite(x.std(ddof=1)) if x.size > 1 else None,
    't_low': finite(low),
    't_high': finite(high),
  }


def curves(rows):
  """{pair kind: {curve: [band per row]}}, {arm: [band of its loss per row]} over seeds."""
  kinds = list(rows[0]['pairs'])
  out = {
    kind: {
      name: [band(get(p) for p in r['pairs'][kind]) for r in rows] for name, get in CURVES.items()
    }
    for kind in kinds
  }
  losses = {arm: [band(r['loss'][arm]) for r in rows] for arm in rows[0]['loss']}
  return out, losses


def proportion(count, nobs, interval=None):
  """count/nobs with its 95% Wilson score interval (statsmodels), or `interval` (low, high) when
  given (several labels per image: computed over the images, pair_churn)."""
  low, high = interval or proportion_confint(count, nobs, alpha=CI_ALPHA, method=CI_METHOD)
  return {
    'count': int(count),
    'n': int(nobs),
    'rate': count / nobs if nobs else None,
    'ci_low': float(low),
    'ci_high': float(high),
  }


def independent(pairs):
  """The pairs that share no seed with an earlier one (the ceiling pairs of consecutive seeds
  overlap: (s0, s1), (s1, s2), ... keeps (s0, s1), (s2, s3), ...)."""
  used, kept = set(), []
  for p in pairs:
    if not used & set(p['seeds']):
      kept.append(p)
      used |= set(p['seeds'])
  return kept


def disagreement(pairs):
  """Whole-test-set disagreement of each pair ({'seeds', 'count', 'n'}), then across seeds.

  `pairs`: per pair (pair_churn) its churn, the share of predicted labels that differ, with its
  interval (module doc); `across`: band() of the independent pairs' rates (mean, min–max) with
  the t-Wilson interval over seeds as t_low, t_high (`pairs` = how many); `band`: the min–max of
  every pair; `total`: labels differing in all pairs together and their number (a count, not an
  estimate with an interval).
  """
  per_pair = [
    {
      'seeds': p['seeds'],
      **proportion(p['count'], p['n'], (p['ci_low'], p['ci_high']) if 'ci_low' in p else None),
    }
    for p in pairs
  ]
  kept = independent(per_pair)
  rates = [p['rate'] for p in kept]
  low, high = inference.proportion_mean_ci(rates)
  bounded = {'t_low': float(low), 't_high': float(high)} if len(rates) > 1 else {}
  return {
    'pairs': per_pair,
    'total': {'count': sum(p['count'] for p in pairs), 'n': sum(p['n'] for p in pairs)},
    'across': {**band(rates), **bounded, 'pairs': len(kept)},
    'band': band(p['rate'] for p in per_pair),
  }
