"""How each component of the platform gap (analysis/numbers/gap.py) is estimated: its value per
seed from the cell means and its weights, its statistics over those seeds (mean, t-interval,
paired-t and signed-rank p, d_z; for G and R the 90% CI and TOST), and the MixedLM cross-check of
G, N and R over the same cells and seeds (named as a cross-check wherever it is shown).
Reference: docs/statistics.md "The gap decomposition".
"""

import numpy as np
import pandas as pd
from scipy import stats as sps

from analysis import stats
from analysis.numbers import effects


def per_seed(cells, weights, seeds):
  """The component's value per seed: sum of weight x cell mean, over `seeds`."""
  return sum(w * cells[c].loc[seeds].to_numpy() for c, w in weights.items())


def component_stats(d, margin):
  """Estimate, sd, se, df, 95% CI, paired-t p, signed-rank p and d_z of the per-seed values d;
  with a margin also the 90% CI and TOST p."""
  k = len(d)
  mean = float(np.mean(d))
  sd = float(np.std(d, ddof=1)) if k > 1 else np.nan
  se = sd / np.sqrt(k) if k > 1 else np.nan
  low, high = stats.diff_ci(mean, se, k - 1, 0.95) if k > 1 else (np.nan, np.nan)
  if k < 2:
    p = np.nan
  elif se > 0:
    p = float(2 * sps.t.sf(abs(mean) / se, k - 1))
  else:
    p = 1.0 if mean == 0 else 0.0
  _, sr_p, sr_method = stats.signed_rank(d)
  out = {
    'estimate': mean,
    'sd': sd,
    'se': se,
    'df': k - 1,
    'seeds': k,
    'ci_low': low,
    'ci_high': high,
    'p': p,
    'signed_rank_p': sr_p,
    'signed_rank_method': sr_method,
    'd_z': stats.d_z(d),
    'ci90_low': np.nan,
    'ci90_high': np.nan,
    'tost_p': np.nan,
  }
  if margin and k > 1:
    out['ci90_low'], out['ci90_high'], out['tost_p'] = stats.tost(mean, se, k - 1, margin)
  return out


def cross_check(runs, factor, others, ref, summary, native):
  """{key: effects.contrast} of G, N and R from a MixedLM over the same cells and seeds (the
  module doc), each with the cell weights the per-seed estimate used (summary['weights']: N from
  one platform where only it ran both emulations, R = G − that N), or {} when the fit fails; a key
  whose definition needs a cell without runs holds {'note': why} instead; named as a cross-check
  wherever it is shown."""
  a, b = summary['platforms']
  keep = runs['seed'].isin(summary['seeds'])
  for f in others:
    keep &= runs[f].astype(str) == str(ref[f])
  sub = runs[keep].assign(cell=lambda r: r['platform'].astype(str) + '|' + r[factor].astype(str))
  cells_run = set(sub['cell'])
  X = effects.design(sub, ['cell'], {'cell': f'{b}|{native}'})
  try:
    model = effects.fit(sub['value'], X, sub['seed'])
  except (ValueError, np.linalg.LinAlgError):
    return {}
  out = {}
  for key, weights in summary['weights'].items():
    if key not in summary['values']:
      continue
    absent = [f'{e} on {p}' for (p, e), v in weights.items() if v and f'{p}|{e}' not in cells_run]
    if absent:  # the estimate's definition needs a cell the fit has no coefficient for
      out[key] = {'note': 'cannot use the same definition: no runs of ' + ', '.join(absent)}
      continue
    w = pd.Series(
      {f'cell={p}|{e}': v for (p, e), v in weights.items() if f'cell={p}|{e}' in X}, dtype=float
    )
    out[key] = effects.contrast(model, w)
  out['method'] = model['method']
  return out
