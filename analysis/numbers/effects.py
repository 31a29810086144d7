"""The model behind analysis.numbers.attribution: the treatment-coded design, the seed mixed model
(or its seed fixed-effects and OLS alternatives), and linear contrasts of its coefficients with
their intervals.

metric ~ C(factor, Treatment(reference)) + ... [+ chosen interactions] + (1 | seed), fitted by
statsmodels MixedLM (REML) with a random intercept per seed: runs that share a seed share the
initialisation and data order, so they are correlated across arms. A term `factor=level` is the
difference from that factor's reference level with the other factors held fixed, with a 95% Wald
(normal) interval as MixedLM reports it. MixedLM runs up to MIXED_MAX_ROWS runs: its fit loops over
the seeds at every iteration (attribution's two fits, effects and gap: 15 s at 20,000 runs, 51 to
118 s at 100,000 on a busy 2-core CPU; BENCHMARKS.md). Beyond that, or if the mixed fit fails (an
exception, no convergence, a boundary or singular fit such as a seed variance of zero): OLS with
one fixed effect per seed by the within transformation (each seed's mean removed from the metric
and the design: the coefficients of OLS with seed dummies, by Frisch-Waugh-Lovell, without a runs x
seeds matrix), standard errors clustered by seed (CR1: statsmodels on the demeaned data,
G/(G-1) (N-1)/(N-K) with K the factor columns, the seed effects being nested in their clusters;
t with seeds - 1 df; Cameron & Miller 2015, J. Human Resources 50(2), on fixed effects). When every
seed ran every arm the fixed-effects and mixed estimates coincide. With one run per seed, one
seed, or no seed column: OLS with HC3 standard errors (t with residual df). The `method` line says
which model ran and why. A contrast c'b has standard error sqrt(c'Vc) from the fit's covariance V.

Memory: check_size refuses, before any fit, a design whose arrays (DESIGN_COPIES runs x columns
doubles alive at once) would exceed MEMORY_LIMIT_GB.
"""

import warnings

import numpy as np
import pandas as pd
import statsmodels.api as sm

from analysis import inputs
from runrecord import record

CSV_COLUMNS = ['term', 'estimate', 'ci_low', 'ci_high', 'p']
MIXED_MAX_ROWS = 20_000
MEMORY_LIMIT_GB = 2.0
DESIGN_COPIES = 6  # runs x columns arrays alive at once in a fit (design, demeaned, pinv, scores)


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
  return sorted(runs[factor].unique(), key=inputs.seed_key)


def find_factor(name, columns, flag):
  """The --factors name that `name` means (as written, or resolving to the same column)."""
  for factor, col in columns.items():
    if name in (factor, col) or col in (
      f'{record.ARM_PREFIX}{name}',
      f'numerics.effective.{name}',
      f'config.{name}',
      f'final.{name}',
    ):
      return factor
  raise ValueError(f'{flag}: {name!r} is not one of --factors ({", ".join(columns)}); add it there')


def check_size(runs, factors, ref, interactions=()):
  """Raise (naming --factors) when the design's arrays would not fit in MEMORY_LIMIT_GB."""
  counts = {f: runs[f].nunique() for f in factors}
  k = 1 + sum(c - 1 for c in counts.values())
  for a, b in interactions:
    cells = runs.loc[(runs[a] != ref[a]) & (runs[b] != ref[b]), [a, b]]
    k += len(cells.drop_duplicates())
  gb = len(runs) * k * 8 * DESIGN_COPIES / 1024**3
  if gb > MEMORY_LIMIT_GB:
    widest = max(counts, key=counts.get)
    raise ValueError(
      f'--factors: the model would need {k:,} columns for {len(runs):,} runs (about {gb:.1f} GB '
      f'of arrays; this analysis allows {MEMORY_LIMIT_GB:g} GB): {widest} has '
      f'{counts[widest]:,} levels; a factor is a setting with a few levels: drop it from '
      '--factors (or the interactions that multiply it)'
    )


def design(runs, factors, ref, interactions=()):
  """Treatment-coded design matrix: Intercept, `factor=level` columns, `A=a:B=b` products of the
  observed interaction cells. Raises if it is too large (check_size) or if a column is a linear
  combination of the others (found on the distinct rows: the same column space, a few rows)."""
  check_size(runs, factors, ref, interactions)
  columns, by_factor = {'Intercept': np.ones(len(runs))}, {}
  for f in factors:
    by_factor[f] = [f'{f}={lv}' for lv in levels(runs, f) if lv != ref[f]]
    for name in by_factor[f]:
      columns[name] = (runs[f] == name.split('=', 1)[1]).to_numpy(float)
  for a, b in interactions:
    for ca in by_factor[a]:
      for cb in by_factor[b]:
        if (columns[ca] * columns[cb]).any():
          columns[f'{ca}:{cb}'] = columns[ca] * columns[cb]
  X = pd.DataFrame(columns, index=runs.index)
  r = np.abs(np.diag(np.linalg.qr(np.unique(X.to_numpy(), axis=0), mode='r')))
  small = np.flatnonzero(r <= r.max() * max(X.shape) * np.finfo(float).eps)
  if small.size or len(r) < X.shape[1]:
    name = X.columns[small[0] if small.size else len(r)]
    raise ValueError(
      f'--factors: term {name} is confounded with the terms before it '
      '(no run separates them); drop one of those factors or interactions'
    )
  return X


def ols(y, X, cov, groups=None, note=''):
  """OLS with HC3 or seed-clustered standard errors, t intervals; raises if they are not finite."""
  kwds = {'groups': pd.factorize(groups)[0]} if cov == 'cluster' else {}
  res = sm.OLS(y, X).fit(cov_type=cov, cov_kwds=kwds or None, use_t=True)
  what = (
    'OLS, standard errors clustered by seed (t, seeds - 1 df)'
    if cov == 'cluster'
    else 'OLS with HC3 standard errors (t, residual df)'
  )
  if not np.all(np.isfinite(res.bse)):
    raise ValueError(
      f'--factors: {what.split(",")[0]} gives no finite standard error here (a '
      'coefficient rests on single runs); add runs (seeds) or drop factors'
    )
  return {'result': res, 'kind': cov, 'method': f'{what}; {note}'}


def seed_fixed_effects(y, X, seeds, note):
  """OLS with one fixed effect per seed by the within transformation, errors clustered by seed
  (see the module doc); plain clustered OLS when a factor does not vary within any seed."""
  groups = pd.factorize(seeds)[0]

  def demean(v):
    return v - v.groupby(groups).transform('mean')

  within = demean(X.drop(columns='Intercept'))
  if not within.shape[1] or np.linalg.matrix_rank(within.to_numpy()) < within.shape[1]:
    return ols(
      y, X, 'cluster', seeds, note + '; seed fixed effects left out: confounded with factors'
    )
  res = sm.OLS(demean(y), within).fit(cov_type='cluster', cov_kwds={'groups': groups}, use_t=True)
  return {
    'result': res,
    'kind': 'within',
    'method': (
      "OLS with seed fixed effects (within transformation: each seed's mean removed), standard "
      'errors clustered by seed (CR1, the seed effects not counted in K; t, seeds - 1 df); ' + note
    ),
  }


def mixed(y, X, seeds):
  """(MixedLM model dict, '') or (None, why it failed)."""
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
  if why:
    return None, why
  return {
    'result': res,
    'kind': 'mixed',
    'method': f'MixedLM (REML), random intercept per seed '
    f'({seeds.nunique()} seeds, seed sd {np.sqrt(res.cov_re.iloc[0, 0]):.3g}); 95% Wald '
    '(normal) intervals',
  }, ''


def fit(y, X, seeds):
  """The model the size and the data allow (see the module doc), as a dict: result, kind, method."""
  n, k = X.shape
  if n <= k:
    raise ValueError(
      f'--factors: {n} usable runs for {k} coefficients (intercept and factor '
      'levels) leave no residual to estimate the error from; add runs (seeds) or '
      'drop factors'
    )
  if seeds is None:
    return ols(y, X, 'HC3', note='no seed column, so runs are taken as independent')
  if seeds.nunique() < 2:
    return ols(y, X, 'HC3', note='one seed, so its effect is the intercept')
  if seeds.value_counts().max() < 2:
    return ols(y, X, 'HC3', note='one run per seed, so seed effects cannot be separated')
  if n > MIXED_MAX_ROWS:
    return seed_fixed_effects(
      y,
      X,
      seeds,
      (
        f'MixedLM not fitted: {n:,} runs > {MIXED_MAX_ROWS:,} (its fit loops over the seeds; '
        'BENCHMARKS.md)'
      ),
    )
  model, why = mixed(y, X, seeds)
  return model or seed_fixed_effects(y, X, seeds, f'mixed fit failed ({why})')


def contrast(model, weights):
  """estimate, se, 95% CI, p and df of sum(weights[col] * coef[col]) (statsmodels t_test)."""
  res = model['result']
  k = res.k_fe if model['kind'] == 'mixed' else len(res.params)
  names = list(res.params.index[:k])
  L = np.zeros(k)
  for col, w in weights.items():
    if col in names:
      L[names.index(col)] += w
    elif w:  # the within fit has no intercept: only differences of cells are estimable
      raise ValueError(f'{col} is not estimable by {model["method"].split(";")[0]}')
  if not L.any():
    return {'estimate': 0.0, 'se': 0.0, 'ci_low': 0.0, 'ci_high': 0.0, 'p': np.nan, 'df': np.inf}
  tt = res.t_test(L[None, :])
  low, high = np.ravel(tt.conf_int(alpha=0.05))
  return {
    'estimate': float(np.ravel(tt.effect)[0]),
    'se': float(np.ravel(tt.sd)[0]),
    'ci_low': float(low),
    'ci_high': float(high),
    'p': float(np.ravel(tt.pvalue)[0]),
    'df': float(getattr(tt, 'df_denom', None) or np.inf),
  }


def term_table(model, X):
  """One row per coefficient but the intercept: the CSV table."""
  rows = [{'term': c, **contrast(model, {c: 1.0})} for c in X.columns if c != 'Intercept']
  return pd.DataFrame(rows, columns=CSV_COLUMNS + ['se', 'df'])


def arm_rows(model, X, runs, factors, ref):
  """Each observed arm (combination of factor levels) minus the reference arm, from the model."""
  keys = list(zip(*(runs[f] for f in factors), strict=True))
  index = {}
  codes = [index.setdefault(key, len(index)) for key in keys]
  means = X.groupby(codes).mean()  # each arm's row of the design (its runs' mean)
  base = tuple(ref[f] for f in factors)
  rows = []
  for key in sorted(set(index) - {base}):
    w = means.loc[index[key]].copy()
    w['Intercept'] -= 1.0
    rows.append(
      {
        'arm': ', '.join(f'{f}={v}' for f, v in zip(factors, key, strict=True)),
        **contrast(model, w),
      }
    )
  return pd.DataFrame(rows, columns=['arm'] + CSV_COLUMNS[1:] + ['se', 'df'])


def formula(metric, factors, ref, interactions, has_seed):
  terms = [f"C({f}, Treatment('{ref[f]}'))" for f in factors] + [
    f'{a}:{b}' for a, b in interactions
  ]
  return f'{metric} ~ ' + ' + '.join(terms) + (' + (1 | seed)' if has_seed else '')
