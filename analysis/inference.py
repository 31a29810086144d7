"""The tests and intervals behind the tables, each checked against scipy/statsmodels in the tests:
means' intervals, paired and Welch t, TOST, the rank tests, effect sizes, Fieller, Holm, power and
the variance components of a crossed design (docs/statistics.md)."""

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats import multitest
from statsmodels.stats import power as smp

ALPHA = 0.05
POWER = 0.8
BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 9999
BCA_MIN_N = 50  # below this the arm table uses t-intervals (BCa under-covers, see above)
BCA_MAX_N = 5000  # from this on t-intervals again (they agree with BCa, which costs n^2)
T_METHOD = 't-interval'
BCA_METHOD = 'BCa bootstrap'
RESOLUTION = 1e-9  # relative: a spread below this share of the values' size is float noise
MW_EXACT_MAX_N = 100
MW_PERMUTATION_MAX_SPLITS = 5000  # C(14, 7) = 3432: 7 + 7 values; about 0.03 s
MW_EXACT = 'exact'
SIGNED_RANK_EXACT_MAX_N = 50  # dynamic programming: microseconds
SR_EXACT = 'exact (sign flips, ties as midranks)'
SR_NORMAL = 'normal approx. (tie corrected)'
MW_PERMUTATION = 'exact permutation (ties)'
MW_NORMAL = 'normal approx. (tie and continuity corrected)'


def ci_method(n):
  """The interval method the arm table uses for a mean of n values."""
  return T_METHOD if n < BCA_MIN_N or n >= BCA_MAX_N else BCA_METHOD


def t_ci(x, level=0.95):
  """Student t-interval of the mean along the last axis: (low, high), arrays for 2-D x."""
  x = np.asarray(x, float)
  n = x.shape[-1]
  if n < 2:
    return np.full(x.shape[:-1], np.nan)[()], np.full(x.shape[:-1], np.nan)[()]
  half = sps.t.ppf(0.5 + level / 2, n - 1) * x.std(-1, ddof=1) / np.sqrt(n)
  return x.mean(-1) - half, x.mean(-1) + half


def bca_ci(x, level=0.95):
  """BCa bootstrap interval of the mean along the last axis (scipy.stats.bootstrap, fixed rng)."""
  x = np.asarray(x, float)
  if x.ndim == 1 and len(x) < 2:
    return np.nan, np.nan
  if x.ndim == 1 and np.ptp(x) == 0:
    return x[0], x[0]
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    res = sps.bootstrap(
      (x,),
      np.mean,
      axis=-1,
      confidence_level=level,
      method='BCa',
      n_resamples=BOOTSTRAP_RESAMPLES,
      batch=100,
      rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
  return res.confidence_interval.low, res.confidence_interval.high


def mean_ci(x, level=0.95):
  """(low, high, method): the arm table's interval of the mean along the last axis of x."""
  x = np.asarray(x, float)
  method = ci_method(x.shape[-1])
  low, high = (t_ci if method == T_METHOD else bca_ci)(x, level)
  return low, high, method


def proportion_mean_ci(p, level=0.95):
  """(low, high) of the mean of per-unit proportions p (one per independent unit)."""
  p = np.asarray(p, float)
  m = len(p)
  if m < 2:
    return np.nan, np.nan
  mean, s = float(p.mean()), float(p.std(ddof=1))
  if s == 0 or mean <= 0 or mean >= 1:
    return mean, mean
  k = sps.t.ppf(0.5 + level / 2, m - 1) ** 2 * s**2 / (m * mean * (1 - mean))
  root = math.sqrt(k * mean * (1 - mean) + k * k / 4)
  return (mean + k / 2 - root) / (1 + k), (mean + k / 2 + root) / (1 + k)


def spread_sd(d):
  """The sd of d (ddof 1), exactly 0 when the values are equal to float resolution (RESOLUTION
  of their size, at least 1): the one zero-variance rule of contrasts, gaps and noise floors."""
  d = np.asarray(d, float)
  return 0.0 if np.ptp(d) <= RESOLUTION * max(1.0, np.abs(d).max()) else float(np.std(d, ddof=1))


def exact(mean):
  """(t, p) of a mean whose values do not vary: p = 1 at 0 (to float resolution), else 0."""
  zero = abs(mean) <= RESOLUTION
  return (0.0 if zero else np.copysign(np.inf, mean)), (1.0 if zero else 0.0)


def welch(a, b):
  """(t, df, p): two-sided Welch t-test of mean(a) - mean(b) (exact when neither arm varies)."""
  if spread_sd(a) == spread_sd(b) == 0:
    t, p = exact(np.mean(a) - np.mean(b))
    return t, len(a) + len(b) - 2, p
  r = sps.ttest_ind(a, b, equal_var=False)
  return r.statistic, r.df, r.pvalue


def paired(a, b):
  """(t, df, p): two-sided paired t-test of mean(a - b); a and b aligned by seed (exact when every
  difference is the same)."""
  d = np.asarray(a, float) - np.asarray(b, float)
  if spread_sd(d) == 0:
    t, p = exact(d.mean())
    return t, len(d) - 1, p
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    r = sps.ttest_rel(a, b)
  return r.statistic, r.df, r.pvalue


def welch_se_df(a, b):
  """(standard error, Welch–Satterthwaite df) of mean(a) - mean(b)."""
  va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
  se = np.sqrt(va + vb)
  df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else np.inf
  return se, df


def diff_ci(diff, se, df, level):
  """t-interval (low, high) at `level` of a difference estimate with standard error se."""
  half = sps.t.ppf(0.5 + level / 2, df) * se if se > 0 else 0.0
  return diff - half, diff + half


def tost(diff, se, df, margin):
  """(ci90_low, ci90_high, p): TOST of |true difference| < margin for an estimate with t errors."""
  if se == 0:  # no variance: within only if |diff| is below the margin beyond float resolution
    return diff, diff, (0.0 if abs(diff) < margin - RESOLUTION * max(1.0, margin) else 1.0)
  p_low = sps.t.sf((diff + margin) / se, df)
  p_high = sps.t.cdf((diff - margin) / se, df)
  return (*diff_ci(diff, se, df, 1 - 2 * ALPHA), max(p_low, p_high))


def mw_method(a, b):
  """The Mann–Whitney method: exact without ties, a permutation test with ties, else normal."""
  pooled = np.concatenate([a, b])
  ties = len(np.unique(pooled)) < len(pooled)
  if not ties and max(len(a), len(b)) <= MW_EXACT_MAX_N:
    return MW_EXACT
  if ties and math.comb(len(pooled), len(a)) <= MW_PERMUTATION_MAX_SPLITS:
    return MW_PERMUTATION
  return MW_NORMAL


def mann_whitney(a, b):
  """(U of a, two-sided p, method): scipy.stats.mannwhitneyu by the method mw_method chooses."""
  method = mw_method(a, b)
  res = sps.mannwhitneyu(
    a, b, alternative='two-sided', method='exact' if method == MW_EXACT else 'asymptotic'
  )
  if method != MW_PERMUTATION:
    return res.statistic, res.pvalue, method
  center = len(a) * len(b) / 2

  def distance(x, y, axis):
    return np.abs(sps.mannwhitneyu(x, y, axis=axis, method='asymptotic').statistic - center)

  perm = sps.permutation_test(
    (a, b),
    distance,
    permutation_type='independent',
    vectorized=True,
    alternative='greater',
    n_resamples=np.inf,
  )
  return res.statistic, perm.pvalue, method


def signed_rank(d):
  """(W, two-sided p, method): Wilcoxon's signed-rank test, exact with ties up to 50 values."""
  d = np.asarray(d, float)
  nonzero = d[d != 0]
  if len(nonzero) == 0:
    return np.nan, 1.0, 'all differences 0'
  if len(nonzero) > SIGNED_RANK_EXACT_MAX_N:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      res = sps.wilcoxon(nonzero, method='approx')
    return float(res.statistic), float(res.pvalue), SR_NORMAL
  halves = np.rint(2 * sps.rankdata(np.abs(nonzero))).astype(int)  # midranks x 2: integers
  counts = np.zeros(halves.sum() + 1)
  counts[0] = 1.0
  for h in halves:  # each rank enters the positive sum or not
    counts[h:] = counts[h:] + counts[:-h].copy() if h else counts[h:]
  probs = counts / counts.sum()
  w = int(halves[nonzero > 0].sum())
  p = min(1.0, 2 * min(probs[: w + 1].sum(), probs[w:].sum()))
  return min(w, halves.sum() - w) / 2, float(p), SR_EXACT


def rank_floor(n_a, n_b=None):
  """The smallest two-sided p the rank test can give at these sizes (untied, as extreme as can be):
  signed-rank over n_a pairs, else Mann–Whitney of n_a against n_b."""
  if n_b is None:
    return signed_rank(np.arange(1.0, n_a + 1))[1]
  return mann_whitney(np.arange(n_a) + n_b, np.arange(n_b))[1]


def d_z(d):
  """Paired standardised effect mean(d) / sd(d) (Cohen's d_z); NaN when sd is 0 or n < 2."""
  sd = spread_sd(d) if len(d) > 1 else np.nan
  return float(np.mean(d) / sd) if sd > 0 else np.nan


def fieller(num, den, level=0.95):
  """(s = mean(num) / mean(den), low, high): Fieller's interval for a ratio of paired means."""
  num, den = np.asarray(num, float), np.asarray(den, float)
  k = len(num)
  gbar, nbar = den.mean(), num.mean()
  if k < 2 or gbar == 0:
    return np.nan, np.nan, np.nan
  cov = np.cov(num, den, ddof=1) / k
  v_nn, v_ng, v_gg = cov[0, 0], cov[0, 1], cov[1, 1]
  t2 = sps.t.ppf(0.5 + level / 2, k - 1) ** 2
  a, b, c = gbar**2 - t2 * v_gg, nbar * gbar - t2 * v_ng, nbar**2 - t2 * v_nn
  s = nbar / gbar
  if a <= 0 or b * b - a * c < 0:
    return s, -np.inf, np.inf
  root = np.sqrt(b * b - a * c)
  return s, (b - root) / a, (b + root) / a


def hedges_g(a, b):
  """Bias-corrected standardised mean difference (mean(a) - mean(b)) / pooled sd × J."""
  na, nb = len(a), len(b)
  sp = np.sqrt(((na - 1) * np.var(a, ddof=1) + (nb - 1) * np.var(b, ddof=1)) / (na + nb - 2))
  if spread_sd(a) == spread_sd(b) == 0 or sp == 0:
    return np.nan
  return (np.mean(a) - np.mean(b)) / sp * (1 - 3 / (4 * (na + nb) - 9))


def holm(pvalues):
  """Holm step-down adjusted p-values (statsmodels); NaN entries stay NaN and are no tests."""
  p = np.asarray(pvalues, float)
  out, tested = np.full_like(p, np.nan), ~np.isnan(p)
  out[tested] = multitest.multipletests(p[tested], method='holm')[1]
  return out


def within_sd(values, labels):
  """(pooled within-group sd, df) of `values` grouped by `labels`."""
  values = pd.Series(np.asarray(values, float))
  labels = np.asarray(labels)
  df = len(values) - len(pd.unique(labels))
  if not df:
    return np.nan, 0
  deviations = values - values.groupby(labels).transform('mean')
  return float(np.sqrt((deviations**2).sum() / df)), df


def smallest_n(power_at, target):
  """Smallest integer n >= 2 with power_at(n) >= target (doubling, then bisection)."""
  if power_at(2) >= target:
    return 2
  low, high = 2, 4
  while power_at(high) < target:
    low, high = high, high * 2
    if high > 10**7:
      return np.inf
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if power_at(mid) < target else (low, mid)
  return high


def nct_power(es, n, is_paired, alternative='two-sided'):
  """Power of a one-sample (paired) or two-sample t-test at effect size es, n per arm (pairs)."""
  df, nc = (n - 1, es * np.sqrt(n)) if is_paired else (2 * n - 2, es * np.sqrt(n / 2))

  def tail(value, normal):  # scipy's far tails: NaN
    return normal if value != value else value

  if alternative == 'larger':
    crit = sps.t.ppf(1 - ALPHA, df)
    return float(tail(sps.nct.sf(crit, df, nc), sps.norm.sf(crit - nc)))
  crit = sps.t.ppf(1 - ALPHA / 2, df)
  return float(
    tail(sps.nct.sf(crit, df, nc), sps.norm.sf(crit - nc))
    + tail(sps.nct.cdf(-crit, df, nc), sps.norm.cdf(-crit - nc))
  )


def power_at(sd, margin, n, is_paired=False):
  """(power to detect a true ±margin, power to show equivalence within it at 0)."""
  if not sd > 0 or n < 2:
    return np.nan, np.nan
  es, solver = margin / sd, smp.TTestPower() if is_paired else smp.TTestIndPower()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    diff = solver.power(es, n, ALPHA)
    one_side = solver.power(es, n, ALPHA, alternative='larger')
  if diff != diff:
    diff = nct_power(es, n, is_paired)
  if one_side != one_side:
    one_side = nct_power(es, n, is_paired, 'larger')
  return diff, max(0.0, 2 * one_side - 1)


def seeds_needed(sd, margin, is_paired=False):
  """(n for 80% power to detect ±margin, n to show equivalence within ±margin at 0)."""
  if not sd > 0:
    return 2, 2
  es, solver = margin / sd, smp.TTestPower() if is_paired else smp.TTestIndPower()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    diff = smallest_n(lambda n: solver.power(es, n, ALPHA), POWER)
    equiv = smallest_n(
      lambda n: solver.power(es, n, ALPHA, alternative='larger'), 1 - (1 - POWER) / 2
    )
  return diff, equiv


VARIANCE_METHOD = (
  'two-way crossed random-effects ANOVA, method of moments (expected mean squares); '
  "negative estimates truncated at 0; 95% intervals by Satterthwaite's df (exact χ² for "
  'a single mean square)'
)
COMPONENTS = ('init', 'data order', 'init × data order', 'nondeterminism (replicates)')
RESIDUAL = 'init × data order + nondeterminism (no replicates)'  # R = 1: one residual
MIN_CI_DF = 2.0


def mean_squares(y):
  """{name: (mean square, df)} of an I × J × R array (module doc)."""
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
  """(low, high, ν) of Σ c_k MS_k by Satterthwaite's df (module doc)."""
  value = sum(w * ms[k][0] for k, w in weights.items())
  spread = sum((w * ms[k][0]) ** 2 / ms[k][1] for k, w in weights.items())
  nu = value**2 / spread if spread > 0 else np.nan
  if not value > 0 or not nu >= MIN_CI_DF:
    return np.nan, np.nan, nu
  return (nu * value / sps.chi2.ppf(0.975, nu), nu * value / sps.chi2.ppf(0.025, nu), nu)


def variance_components(frame, value='value', init='init_seed', data='data_seed'):
  """One row per component (COMPONENTS; with one run per cell the last two as RESIDUAL)."""
  if frame[init].nunique() < 2 or frame[data].nunique() < 2:
    raise ValueError('variance split: needs at least 2 init seeds and 2 data seeds')
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
  y = ordered[value].to_numpy(float).reshape(len(inits), len(data_seeds), int(full.iloc[0]))
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
  table['method'] = VARIANCE_METHOD
  return table
