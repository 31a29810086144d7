"""The models that agreement compares: the entries (runs) of analysis/numbers/agreement.py grouped
by arm and seed (a unit: one model, its replicates), their order, their recorded init and
data-order seeds, the disjoint pairs of different models of one arm, and one row of the churn
table over seeds.
Reference: docs/statistics.md "Agreement between models".
"""

import numpy as np

from analysis import stats
from analysis.inputs import seed_key


def unit_name(entry):
  """What churn counts for this run's task."""
  return 'image × attribute labels' if np.ndim(entry['pred']['predicted']) > 1 else 'images'


def by_unit(entries):
  """{(arm, seed): [entries]} in the entries' order."""
  units = {}
  for e in entries:
    units.setdefault((e['arm'], e['seed']), []).append(e)
  return units


def unit_order(seed):
  """Sort key of a model (runrecord.rules.model_keys): by its seed, numerically, then as text
  ('2 (init 0, data 2)' before '10 (init 3, data 1)')."""
  return (seed_key(str(seed).split(' (')[0]), str(seed))


def seeds_of(units, arm):
  return sorted((s for a, s in units if a == arm), key=unit_order)


def seed_row(kind, a, b, pairing, values, labels, unit, units):
  """One row of the table: the mean over seeds of `values` (fractions) with its t-interval, %."""
  x = 100 * np.asarray(values, float)
  low, high = (100 * v for v in stats.proportion_mean_ci(values)) if len(x) else (np.nan,) * 2

  def first(arm):
    return next((e['platform'] for (u, _), es in units.items() if u == arm for e in es), '')

  return {
    'kind': kind,
    'a': a,
    'b': b,
    'platform_a': first(a),
    'platform_b': first(b),
    'pairing': pairing,
    'churn_pct': x.mean() if len(x) else np.nan,
    'ci_low': low,
    'ci_high': high,
    'seeds': len(x),
    'seed_list': ', '.join(map(str, labels)),
    'per_seed_pct': ', '.join(f'{v:.3g}' for v in x),
    'unit': unit,
    'check': '',
    'values': list(values),
  }  # kept for pooling, not a column


def sources(units, arm, seed):
  """(init, data) seeds of one model of `arm`, (None, None) where not recorded."""
  first = units[(arm, seed)][0]
  return first.get('init'), first.get('data')


def both_differ(units, arm, s, t):
  """Do models s and t of `arm` differ in initial weights and in data order (true where the
  init and data seeds are not recorded: then they are the seed)?"""
  (i1, d1), (i2, d2) = sources(units, arm, s), sources(units, arm, t)
  if None in (i1, d1, i2, d2):
    return True
  return str(i1) != str(i2) and str(d1) != str(d2)


def disjoint_pairs(units, arm):
  """Pairs of different models of `arm` that differ in init and data order (both_differ), each
  model in one pair at most: in sorted order, each unused model with the next unused one it
  differs from in both (with seed = init = data: (s1, s2), (s3, s4), ...)."""
  seeds, used, pairs = seeds_of(units, arm), set(), []
  for i, s in enumerate(seeds):
    if s in used:
      continue
    t = next((t for t in seeds[i + 1 :] if t not in used and both_differ(units, arm, s, t)), None)
    if t is not None:
      pairs.append((s, t))
      used |= {s, t}
  return pairs
