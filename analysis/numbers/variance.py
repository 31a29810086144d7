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
σ̂²_ab = (MS_ab − MS_e)/R, σ̂²_nondet = MS_e. A negative estimate is truncated at 0 (`truncated`
says so; the untruncated value is kept in `estimate`). Shares: each truncated component over
their sum. The nearest wrong version, one_way(), treats init seeds as the only factor and puts
data order into the residual.
"""

import numpy as np
import pandas as pd

METHOD = ('two-way crossed random-effects ANOVA with replication, method of moments (expected '
          'mean squares); negative estimates truncated at 0')
COMPONENTS = ('init', 'data order', 'init × data order', 'nondeterminism (replicates)')
INIT_COLUMNS = ('init_seed', 'config.init_seed')
DATA_COLUMNS = ('data_seed', 'config.data_seed')


def cell_array(frame, value, init, data):
  """The values as an I × J × R array (balanced); ValueError naming the missing or short cells."""
  counts = frame.groupby([init, data]).size()
  inits, datas = sorted(frame[init].unique()), sorted(frame[data].unique())
  full = counts.reindex(pd.MultiIndex.from_product([inits, datas]), fill_value=0)
  if full.nunique() != 1 or full.iloc[0] < 2:
    short = ', '.join(f'({i}, {j}): {n}' for (i, j), n in full.items() if n != full.max())
    raise ValueError(f'variance split: needs every (init_seed, data_seed) cell run the same number '
                     f'of times, at least twice (replicates); runs per cell: {short or full.iloc[0]}')
  ordered = frame.sort_values([init, data], kind='stable')
  return ordered[value].to_numpy(float).reshape(len(inits), len(datas), int(full.iloc[0]))


def mean_squares(y):
  """{name: (mean square, df)} of an I × J × R array (module doc)."""
  n_i, n_j, n_r = y.shape
  grand, cell = y.mean(), y.mean(axis=2)
  row, col = cell.mean(axis=1), cell.mean(axis=0)
  inter = cell - row[:, None] - col[None, :] + grand
  return {'init': (n_j * n_r * np.sum((row - grand) ** 2) / (n_i - 1), n_i - 1),
          'data order': (n_i * n_r * np.sum((col - grand) ** 2) / (n_j - 1), n_j - 1),
          'init × data order': (n_r * np.sum(inter ** 2) / ((n_i - 1) * (n_j - 1)),
                                (n_i - 1) * (n_j - 1)),
          'nondeterminism (replicates)': (np.sum((y - cell[..., None]) ** 2)
                                          / (n_i * n_j * (n_r - 1)), n_i * n_j * (n_r - 1))}


def estimates(ms, shape):
  """{component: method-of-moments estimate} from mean_squares' {name: (MS, df)} of an I × J × R
  array (module doc), untruncated."""
  n_i, n_j, n_r = shape
  m = {k: v[0] for k, v in ms.items()}
  ab, e = m['init × data order'], m['nondeterminism (replicates)']
  return {'init': (m['init'] - ab) / (n_j * n_r), 'data order': (m['data order'] - ab) / (n_i * n_r),
          'init × data order': (ab - e) / n_r, 'nondeterminism (replicates)': e}


def variance_components(frame, value='value', init='init_seed', data='data_seed'):
  """One row per component (COMPONENTS): mean_square, df, estimate (method of moments),
  variance (truncated at 0), sd, share_pct, truncated; `method` names the estimator."""
  if frame[init].nunique() < 2 or frame[data].nunique() < 2:
    raise ValueError('variance split: needs at least 2 init seeds and 2 data seeds')
  y = cell_array(frame, value, init, data)
  ms = mean_squares(y)
  estimate = estimates(ms, y.shape)
  rows = [{'component': c, 'mean_square': ms[c][0], 'df': ms[c][1], 'estimate': estimate[c],
           'variance': max(estimate[c], 0.0), 'truncated': estimate[c] < 0} for c in COMPONENTS]
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
  runs record init and data-order seeds; arms whose design is not a full crossing with
  replicates are left out. Empty when no arm qualifies."""
  columns = seed_columns(runs)
  if columns is None:
    return pd.DataFrame()
  tables = []
  for arm, group in runs.groupby('arm', sort=True):
    try:
      table = variance_components(group, value, *columns)
    except ValueError:
      continue
    tables.append(table.assign(arm=arm, runs=len(group)))
  return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
