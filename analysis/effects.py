"""The model behind analysis.attribution: the treatment-coded design, the seed mixed model (or its
OLS fallbacks), and linear contrasts of its coefficients with their intervals.

metric ~ C(factor, Treatment(reference)) + ... [+ chosen interactions] + (1 | seed), fitted by
statsmodels MixedLM (REML) with a random intercept per seed: runs that share a seed share the
initialisation and data order, so they are correlated across arms. A term `factor=level` is the
difference from that factor's reference level with the other factors held fixed, with a 95% Wald
(normal) interval as MixedLM reports it. If the mixed fit fails (an exception, no convergence, a
boundary or singular fit such as a seed variance of zero) the model is refitted by OLS with one fixed
effect per seed and standard errors clustered by seed (t with seeds - 1 df, Cameron & Miller 2015);
with one run per seed, or no seed column, by OLS with HC3 standard errors (t with residual df). The
`method` line says which. A contrast c'b has standard error sqrt(c'Vc) from the fit's covariance V.
"""

import warnings

import numpy as np
import pandas as pd
import statsmodels.api as sm

from analysis import stats
from trainer import record

CSV_COLUMNS = ['term', 'estimate', 'ci_low', 'ci_high', 'p']


FAILED_FIT = ('boundary', 'singular', 'Hessian')  # words of MixedLM warnings that void its fit


def parse_pairs(items, flag):
  """['profile=native', ...] (or a dict) -> {'profile': 'native'}."""
  if isinstance(items, dict):
    return {str(k): str(v) for k, v in items.items()}
  out = {}
  for item in [items] if isinstance(items, str) else items or ():
    name, eq, value = str(item).partition('=')
    if not (eq and name and value):
      raise ValueError(f'{flag}: {item!r} is not factor=level; write e.g. {flag} profile=native')
    out[name] = value
  return out


def levels(runs, factor):
  """A factor's levels, sorted (numbers numerically)."""
  return sorted(runs[factor].unique(), key=stats.seed_key)


def find_factor(name, columns, flag):
  """The --factors name that `name` means (as written, or resolving to the same column)."""
  for factor, col in columns.items():
    if name in (factor, col) or col in (f'{record.ARM_PREFIX}{name}', f'numerics.effective.{name}',
                                        f'config.{name}', f'final.{name}'):
      return factor
  raise ValueError(f'{flag}: {name!r} is not one of --factors ({", ".join(columns)}); add it there')


def design(runs, factors, ref, interactions=()):
  """Treatment-coded design matrix: Intercept, `factor=level` columns, `A=a:B=b` products of the
  observed interaction cells. Raises if a column is a linear combination of the others."""
  X = pd.DataFrame({'Intercept': 1.0}, index=runs.index)
  by_factor = {}
  for f in factors:
    by_factor[f] = [f'{f}={lv}' for lv in levels(runs, f) if lv != ref[f]]
    for name in by_factor[f]:
      X[name] = (runs[f] == name.split('=', 1)[1]).astype(float)
  for a, b in interactions:
    for ca in by_factor[a]:
      for cb in by_factor[b]:
        if (X[ca] * X[cb]).any():
          X[f'{ca}:{cb}'] = X[ca] * X[cb]
  for i in range(2, X.shape[1] + 1):
    if np.linalg.matrix_rank(X.iloc[:, :i].to_numpy()) < i:
      raise ValueError(f'--factors: term {X.columns[i - 1]} is confounded with the terms before it '
                       '(no run separates them); drop one of those factors or interactions')
  return X


def ols(y, X, cov, groups=None, note=''):
  """OLS with HC3 or seed-clustered standard errors, t intervals."""
  kwds = {'groups': pd.factorize(groups)[0]} if cov == 'cluster' else {}
  res = sm.OLS(y, X).fit(cov_type=cov, cov_kwds=kwds or None, use_t=True)
  fe = ' with seed fixed effects' if any(c.startswith('seed=') for c in X) else ''
  what = (f'OLS{fe}, standard errors clustered by seed (t, seeds - 1 df)' if cov == 'cluster'
          else 'OLS with HC3 standard errors (t, residual df)')
  return {'result': res, 'kind': cov, 'method': f'{what}; {note}'}


def fit(y, X, seeds):
  """The mixed model with a random intercept per seed, or the OLS fallback (see module doc)."""
  if seeds is None:
    return ols(y, X, 'HC3', note='no seed column, so runs are taken as independent')
  if seeds.value_counts().max() < 2:
    return ols(y, X, 'HC3', note='one run per seed, so seed effects cannot be separated')
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      res = sm.MixedLM(y, X, groups=seeds).fit(reml=True)
    bad = sorted({str(w.message) for w in caught if any(k in str(w.message) for k in FAILED_FIT)})
    if not res.converged:
      bad.append('did not converge')
    if not np.all(np.isfinite(res.bse_fe)):
      bad.append('non-finite standard errors')
    why = '; '.join(bad)
  except Exception as e:  # any failure of the mixed fit means the fallback, said in `method`
    why = f'{type(e).__name__}: {e}'
  if not why:
    n = seeds.nunique()
    return {'result': res, 'kind': 'mixed', 'method': f'MixedLM (REML), random intercept per seed '
            f'({n} seeds, seed sd {np.sqrt(res.cov_re.iloc[0, 0]):.3g}); 95% Wald (normal) intervals'}
  dummies = pd.get_dummies(seeds.astype(str), prefix='seed', prefix_sep='=', drop_first=True)
  Xs = pd.concat([X, dummies.astype(float)], axis=1)
  note = f'mixed fit failed ({why})'
  if np.linalg.matrix_rank(Xs.to_numpy()) < Xs.shape[1]:
    return ols(y, X, 'cluster', seeds, note + '; seed fixed effects left out: confounded with factors')
  return ols(y, Xs, 'cluster', seeds, note)


def contrast(model, weights):
  """estimate, se, 95% CI, p and df of sum(weights[col] * coef[col]) (statsmodels t_test)."""
  res = model['result']
  k = res.k_fe if model['kind'] == 'mixed' else len(res.params)
  names = list(res.params.index[:k])
  L = np.zeros(k)
  for col, w in weights.items():
    L[names.index(col)] += w
  if not L.any():
    return {'estimate': 0.0, 'se': 0.0, 'ci_low': 0.0, 'ci_high': 0.0, 'p': np.nan, 'df': np.inf}
  tt = res.t_test(L[None, :])
  low, high = np.ravel(tt.conf_int(alpha=0.05))
  return {'estimate': float(np.ravel(tt.effect)[0]), 'se': float(np.ravel(tt.sd)[0]),
          'ci_low': float(low), 'ci_high': float(high), 'p': float(np.ravel(tt.pvalue)[0]),
          'df': float(getattr(tt, 'df_denom', None) or np.inf)}


def term_table(model, X):
  """One row per coefficient but the intercept: the CSV table."""
  rows = [{'term': c, **contrast(model, {c: 1.0})} for c in X.columns if c != 'Intercept']
  return pd.DataFrame(rows, columns=CSV_COLUMNS + ['se', 'df'])


def arm_rows(model, X, runs, factors, ref):
  """Each observed arm (combination of factor levels) minus the reference arm, from the model."""
  keys = runs[factors].apply(tuple, axis=1)
  base = tuple(ref[f] for f in factors)
  rows = []
  for key in sorted(set(keys) - {base}):
    w = X[keys == key].mean()
    w['Intercept'] -= 1.0
    rows.append({'arm': ', '.join(f'{f}={v}' for f, v in zip(factors, key)), **contrast(model, w)})
  return pd.DataFrame(rows, columns=['arm'] + CSV_COLUMNS[1:] + ['se', 'df'])


def formula(metric, factors, ref, interactions, has_seed):
  terms = [f"C({f}, Treatment('{ref[f]}'))" for f in factors] + [f'{a}:{b}' for a, b in interactions]
  return f'{metric} ~ ' + ' + '.join(terms) + (' + (1 | seed)' if has_seed else '')
