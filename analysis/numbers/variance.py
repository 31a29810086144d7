"""Where the variance between runs of one arm comes from: initial weights, data order and
nondeterminism (replicates of the same init and data-order seeds). Numbers only.

Model (crossed random effects): y_ijr = μ + a_i + b_j + (ab)_ij + e_ijr, with init seed i = 1..I,
data-order seed j = 1..J and replicate r = 1..R of the same (i, j); a ~ N(0, σ²_init),
b ~ N(0, σ²_data), (ab) ~ N(0, σ²_init×data), e ~ N(0, σ²_nondet), all independent.

Estimator: the two-way crossed random-effects ANOVA with replication, by the method of moments
(expected mean squares; Searle, Casella & McCulloch, Variance Components, 1992, ch. 4), for a
balanced design (every cell R >= 2 runs):
  MS_init = J R Σ_i (ȳ_i·· − ȳ···)² / (I − 1)           E = σ²_e + R σ²_ab + J R σ²_init
  MS_data = I R Σ_j (ȳ_·j· − ȳ···)² / (J − 1)           E = σ²_e + R σ²_ab + I R σ²_data
  MS_ab   = R Σ_ij (ȳ_ij· − ȳ_i·· − ȳ_·j· + ȳ···)² / ((I − 1)(J − 1))   E = σ²_e + R σ²_ab
  MS_e    = Σ_ijr (y_ijr − ȳ_ij·)² / (I J (R − 1))      E = σ²_e
so σ̂²_init = (MS_init − MS_ab)/(J R), σ̂²_data = (MS_data − MS_ab)/(I R),
σ̂²_ab = (MS_ab − MS_e)/R, σ̂²_nondet = MS_e. Without replicates (R = 1, e.g. a deterministic
platform, where a replicate repeats bit for bit) the interaction and the nondeterminism are one
residual, σ̂²_ab+e = MS_ab, and σ̂²_init, σ̂²_data are as above with R = 1. A negative estimate is
truncated at 0 (`truncated` says so; the untruncated value is kept in `estimate`, and the report
says it in words). Shares: each truncated component over their sum.

95% intervals (`ci_low`, `ci_high`, `ci_df`): each estimate is a linear combination Σ c_k MS_k of
independent mean squares with MS_k df_k / E[MS_k] ~ χ²(df_k); Satterthwaite's df
ν = (Σ c_k MS_k)² / Σ (c_k MS_k)² / df_k gives [ν σ̂² / χ²_{0.975}(ν), ν σ̂² / χ²_{0.025}(ν)], exact
(ν = df) for a component that is one mean square (nondeterminism, or the R = 1 residual),
approximate otherwise (it under-covers at small df; Searle, Casella & McCulloch 1992, 4.6). Below
MIN_CI_DF the interval is not given (at ν = 2 its upper bound is already 39× the estimate, at
ν = 1 about 1,000×): `ci_df` says why, more init or data seeds are what it needs; a truncated
(non-positive) estimate has none either.
The nearest wrong version, one_way(), treats init seeds as the only factor and puts data order
into the residual.
Reference: docs/statistics.md "Agreement between models".
"""

import numpy as np
import pandas as pd
from scipy import stats as sps

METHOD = (
  'two-way crossed random-effects ANOVA, method of moments (expected mean squares); '
  "negative estimates truncated at 0; 95% intervals by Satterthwaite's df (exact χ² for "
  'a single mean square)'
)
COMPONENTS = ('init', 'data order', 'init × data order', 'nondeterminism (replicates)')
RESIDUAL = 'init × data order + nondeterminism (no replicates)'  # R = 1: one residual
MIN_CI_DF = 2.0
INIT_COLUMNS = ('init_seed', 'config.init_seed')
DATA_COLUMNS = ('data_seed', 'config.data_seed')


def cell_array(frame, value, init, data):
  """The values as an I × J × R array (balanced); ValueError naming the missing or short cells."""
  counts = frame.groupby([init, data]).size()
  inits, data_seeds = sorted(frame[init].unique()), sorted(frame[data].unique())
  full = counts.reindex(pd.MultiIndex.from_product([inits, data_seeds]), fill_value=0)
  if full.nunique() != 1 or full.iloc[0] < 1:
    short = ', '.join(f'({i}, {j}): {n}' for (i, j), n in full.items() if n != full.max())
    raise ValueError(
      f'variance split: needs every (init_seed, data_seed) cell run the same number '
      f'of times; runs per cell: {short or full.iloc[0]}'
    )
  ordered = frame.sort_values([init, data], kind='stable')
  return ordered[value].to_numpy(float).reshape(len(inits), len(data_seeds), int(full.iloc[0]))


def mean_squares(y):
  """{name: (mean square, df)} of an I × J × R array (module doc); with R = 1 no replicate mean
  square, the interaction one being the residual."""
  n_i, n_j, n_r = y.shape
  grand, cell = y.mean(), y.mean(axis=2)
  row, col = cell.mean(axis=1), cell.mean(axis=0)
  inter = cell - row[:, None] - col[None, :] + grand
  out = {
    'init': (n_j * n_r * np.sum((row - grand) ** 2) / (n_i - 1), n_i - 1),
    'data order': (n_i * n_r * np.sum((col - grand) ** 2) / (n_j - 1), n_j - 1),
    'init × data order': (n_r * np.sum(inter**2) / ((n_i - 1) * (n_j - 1)), (n_i - 1) * (n_j - 1)),
  }
  if n_r > 1:
    out['nondeterminism (replicates)'] = (
      np.sum((y - cell[..., None]) ** 2) / (n_i * n_j * (n_r - 1)),
      n_i * n_j * (n_r - 1),
    )
  return out


def coefficients(shape):
  """{component: {mean square: c_k}}: each estimate as Σ c_k MS_k (module doc)."""
  n_i, n_j, n_r = shape
  ab = 'init × data order'
  out = {
    'init': {'init': 1 / (n_j * n_r), ab: -1 / (n_j * n_r)},
    'data order': {'data order': 1 / (n_i * n_r), ab: -1 / (n_i * n_r)},
  }
  if n_r == 1:
    return {**out, RESIDUAL: {ab: 1.0}}
  e = 'nondeterminism (replicates)'
  return {**out, ab: {ab: 1 / n_r, e: -1 / n_r}, e: {e: 1.0}}


def estimates(ms, shape):
  """{component: method-of-moments estimate} from mean_squares' {name: (MS, df)} of an I × J × R
  array (module doc), untruncated."""
  return {
    c: sum(w * ms[k][0] for k, w in weights.items()) for c, weights in coefficients(shape).items()
  }


def interval(ms, weights):
  """(low, high, ν) of Σ c_k MS_k by Satterthwaite's df (module doc); NaN bounds when the
  estimate is not positive or ν < MIN_CI_DF."""
  value = sum(w * ms[k][0] for k, w in weights.items())
  spread = sum((w * ms[k][0]) ** 2 / ms[k][1] for k, w in weights.items())
  nu = value**2 / spread if spread > 0 else np.nan
  if not value > 0 or not nu >= MIN_CI_DF:
    return np.nan, np.nan, nu
  return (nu * value / sps.chi2.ppf(0.975, nu), nu * value / sps.chi2.ppf(0.025, nu), nu)


def variance_components(frame, value='value', init='init_seed', data='data_seed'):
  """One row per component (COMPONENTS; with one run per cell the last two as RESIDUAL):
  mean_square and df (of the component's own mean square), estimate (method of moments),
  variance (truncated at 0), sd, share_pct, truncated, ci_low, ci_high (of the variance, 95%),
  ci_df (Satterthwaite's ν), replicates (R); `method` names the estimator."""
  if frame[init].nunique() < 2 or frame[data].nunique() < 2:
    raise ValueError('variance split: needs at least 2 init seeds and 2 data seeds')
  y = cell_array(frame, value, init, data)
  ms = mean_squares(y)
  estimate = estimates(ms, y.shape)

  def own(c):
    return ms['init × data order' if c == RESIDUAL else c]

  rows = [
    {
      'component': c,
      'mean_square': own(c)[0],
      'df': own(c)[1],
      'estimate': estimate[c],
      'variance': max(estimate[c], 0.0),
      'truncated': estimate[c] < 0,
      **dict(zip(('ci_low', 'ci_high', 'ci_df'), interval(ms, weights), strict=True)),
      'replicates': y.shape[2],
    }
    for c, weights in coefficients(y.shape).items()
  ]
  table = pd.DataFrame(rows)
  table['sd'] = np.sqrt(table['variance'])
  total = table['variance'].sum()
  table['share_pct'] = 100 * table['variance'] / total if total > 0 else np.nan
  table['method'] = METHOD
  return table


def one_way(frame, value='value', factor='init_seed'):
  """The naive split (the nearest wrong version): one-way random-effects ANOVA by `factor` alone,
  everything else residual. {'between': σ̂²_between, 'within': σ̂²_within}, balanced groups."""
  groups = frame.groupby(factor)[value]
  k, n = groups.ngroups, int(groups.size().iloc[0])
  ms_between = n * np.sum((groups.mean() - frame[value].mean()) ** 2) / (k - 1)
  ms_within = np.sum((frame[value] - groups.transform('mean')) ** 2) / (k * (n - 1))
  return {'between': max((ms_between - ms_within) / n, 0.0), 'within': ms_within}


def seed_columns(runs):
  """(init column, data column) the runs table records, or None when it has no such pair."""
  init = next((c for c in INIT_COLUMNS if c in runs and runs[c].notna().any()), None)
  data = next((c for c in DATA_COLUMNS if c in runs and runs[c].notna().any()), None)
  return (init, data) if init and data else None


def variance_table(runs, value='value'):
  """variance_components per arm of a runs table (stats.prepare's `runs`: `arm`, `value`) whose
  runs set init and data-order seeds apart (more than one of each in the arm); an arm whose
  design is not a full crossing is left out (split_by_arm says why). Empty when no arm
  qualifies."""
  return split_by_arm(runs, value)[0]


def split_by_arm(runs, value='value'):
  """(variance_table, notes): the notes say, per arm whose init or data seeds vary without a full
  crossing, why it has no split ('arm: variance split: needs ...')."""
  columns = seed_columns(runs)
  if columns is None:
    return pd.DataFrame(), []
  tables, notes = [], []
  for arm, group in runs.groupby('arm', sort=True):
    if group[columns[0]].nunique() < 2 and group[columns[1]].nunique() < 2:
      continue  # one init and one data seed (or seed = init = data): no split to make
    if (group[columns[0]].astype(str) == group[columns[1]].astype(str)).all():
      continue  # init and data seeds move together: the seeds of an ordinary study
    try:
      table = variance_components(group, value, *columns)
    except ValueError as e:
      notes.append(f'{arm}: {e}')
      continue
    tables.append(table.assign(arm=arm, runs=len(group)))
  return (pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()), notes
