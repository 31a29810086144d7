"""Per-arm summaries, paired tests, the declared contrasts with Holm and the noise floors; the tests
and intervals behind them, each checked against scipy/statsmodels (docs/statistics.md)."""

import dataclasses
import itertools
import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats import power as smp

from analysis import declaration
from analysis.declaration import resolve_column
from analysis.inputs import Software, arm_labels, is_accuracy, seed_key, seed_text, whole_numbers
from runrecord import record, rules

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
  """Holm step-down adjusted p-values, p_(i) sorted: min(1, max over j <= i of (m - j + 1) p_(j));
  NaN entries stay NaN and are no tests. By hand because statsmodels' multipletests runs a whole
  gc.collect() per call; equal to it in the tests."""
  p = np.asarray(pvalues, float)
  out, tested = np.full_like(p, np.nan), ~np.isnan(p)
  q = p[tested]
  order = np.argsort(q)
  adjusted = np.empty_like(q)
  adjusted[order] = np.minimum(np.maximum.accumulate(q[order] * np.arange(len(q), 0, -1)), 1)
  out[tested] = adjusted
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
  """One row per component (coefficients; with one run per cell the last two as RESIDUAL)."""
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


if TYPE_CHECKING:
  from analysis.agreement import Agreement
  from analysis.attribution import Attribution


def run_deterministic(platform, value):
  """(True/False/None, why): does a run on `platform` whose recorded GPU determinism is `value`
  repeat bit for bit for its seed? None: not recorded."""
  kind = rules.jax_platform(platform)
  if kind == 'gpu' and value is not None and not pd.isna(value):
    return bool(value), f'{record.DETERMINISM_COLUMN}={bool(value)}'
  if kind in ('tpu', 'cpu'):
    return True, platform
  return None, f'platform {platform}: determinism not recorded'


def run_status(frame):
  """Each run's status ('completed' where the table has no status column)."""
  return frame['status'] if 'status' in frame else pd.Series('completed', index=frame.index)


def status_reasons(frame):
  """Why each run is not completed: 'failed: loss is NaN', 'running: step 3/10' ('' if it is)."""
  reason = frame['reason'] if 'reason' in frame else pd.Series('', index=frame.index)
  none = [None] * len(frame)
  steps = zip(frame.get('step', none), frame.get('total_steps', none), strict=True)
  progress = (f'step {a}/{b}' for a, b in steps)
  return [
    f'{s}: {r}' if isinstance(r, str) and r else f'{s}: {p}' if s != 'completed' else ''
    for s, r, p in zip(run_status(frame), reason, progress, strict=True)
  ]


def replicate_table(runs):
  """One row per arm and seed run more than once: the runs, their values, mean and range."""
  columns = ['arm', 'seed', 'n_runs', 'runs', 'values', 'mean', 'range', 'identical']
  keys = ['arm', 'seed', 'config']  # a --group-by arm pools configs: replicates share one
  runs = runs if 'config' in runs else runs.assign(config='')
  repeated = runs[runs.groupby(keys, sort=False)['value'].transform('size') > 1]
  if repeated.empty:
    return pd.DataFrame(columns=columns)
  repeated = repeated.assign(text=[f'{x:.4g}' for x in repeated['value']])
  table = (
    repeated.groupby(keys, sort=False)
    .agg(
      n_runs=('run', 'size'),
      runs=('run', ', '.join),
      values=('text', ', '.join),
      mean=('value', 'mean'),
      low=('value', 'min'),
      high=('value', 'max'),
    )
    .reset_index()
  )
  table['range'] = table['high'] - table['low']
  table['identical'] = table['range'] == 0
  return table[columns]


def lattice(runs, metric, scale):
  """The step of an accuracy measured on one recorded test-set size N: 100 / N pp, whether the
  table holds fractions (scale 100) or percentages (scale 1)."""
  if not is_accuracy(metric) or 'data.test_size' not in runs:
    return None
  sizes = pd.to_numeric(runs['data.test_size'], errors='coerce').dropna().unique()
  return float(max(scale, 100.0) / sizes[0]) if len(sizes) == 1 and sizes[0] > 0 else None


DEFAULT_METRIC = record.DEFAULT_METRIC
DEFAULT_MARGIN = declaration.DEFAULT_MARGIN
MAX_ARMS = 200  # 19,900 pairs: about 3 minutes of pairwise tests (10 ms a pair on a 2-core CPU)
EFFECTIVE = 'numerics.effective.'
IDENTICAL_FIELDS = (
  'platform',
  'device_kind',
  'batchnorm_group',
  'compute_dtype',
  'conv_format',
  'dense_format',
  'matmul_precision',
  'param_dtype',
  'xla_flags',
)
# A pair's verdicts, in the order the reports count them (judge).
VERDICTS = (
  'identical arithmetic',
  'within margin',
  'equivalent',
  'different',
  'not equivalent',
  'inconclusive',
)
UNDECLARED = (
  'none declared: 0.5 pp is the analysis.stats default, not a study decision; '
  'declare one (--margin, --margin-reason)'
)


@dataclasses.dataclass(frozen=True)
class Prepared:
  """The runs read for analysis (one row per included run, with its arm, value and model unit),
  one value per arm and seed (`units`), the replicates and the excluded runs."""

  runs: pd.DataFrame
  units: pd.DataFrame
  replicates: pd.DataFrame
  excluded: pd.DataFrame
  seeded: bool
  group_by: Sequence[str]
  metric: str
  scale: float
  pairing: list[str]
  lattice: Optional[float]


@dataclasses.dataclass(frozen=True)
class Stats(Prepared):
  """Prepared plus one row per arm, every pair's tests (empty unless asked), the margin and unit."""

  arms: pd.DataFrame
  pairs: pd.DataFrame
  small: pd.DataFrame
  margin: float
  margin_reason: str
  unit: str


def prepare(frame, group_by, metric, seed_col=None, scale=None):
  """Split the runs into included / excluded, label each included run's arm, average replicates."""
  if frame.empty:
    raise ValueError('--runs/--csv: no runs to analyse; check the path')
  if not run_status(frame).eq('completed').any():
    listed = '; '.join(
      f'{run} ({why})' for run, why in zip(frame['run'], status_reasons(frame), strict=True)
    )
    raise ValueError(
      f'--runs/--csv: none of the {len(frame)} runs is completed, so there is nothing to '
      f'analyse; finish or rerun them: {listed}'
    )
  metric = resolve_column(frame, metric, '--metric')
  arm_cols = rules.arm_columns(frame)
  group_by = [resolve_column(frame, g, '--group-by') for g in group_by] or arm_cols
  seeded = seed_col is not None or 'seed' in frame.columns
  seed_col = resolve_column(frame, seed_col, '--seed-col') if seed_col else 'seed'
  status = run_status(frame)
  values = pd.to_numeric(frame[metric], errors='coerce')
  bad = status.ne('completed') | ~np.isfinite(values)
  why = [
    w
    if s != 'completed'
    else f'no value for {metric}'
    if pd.isna(v)
    else f'{metric} = {v} is not finite'
    for s, w, v in zip(status[bad], status_reasons(frame[bad]), values[bad], strict=True)
  ]
  excluded = pd.DataFrame({'run': frame.loc[bad, 'run'], 'status': status[bad], 'reason': why})
  excluded, runs = excluded.reset_index(drop=True), frame[~bad].copy()
  if runs.empty:
    raise ValueError(
      f'--runs/--csv: none of the {len(frame)} runs is completed with a {metric}; '
      'see the excluded list'
    )
  if scale is None:
    scale = 100.0 if is_accuracy(metric) and values[runs.index].abs().max() <= 1 else 1.0
  runs['value'] = values[runs.index] * scale
  runs['base_seed'] = whole_numbers(runs[seed_col]) if seeded else None
  parts = [runs[c] if seed_col == 'seed' and c in runs else None for c in record.SEED_PARTS]
  keys = rules.model_keys(runs['base_seed'], *parts) if seeded else None
  runs['seed'] = pd.Series(keys, index=runs.index, dtype=object) if seeded else None
  runs['seeded'] = seeded & runs['seed'].notna()
  runs['arm'] = arm_labels(runs, group_by)
  runs['config'] = arm_labels(runs, arm_cols) if group_by != arm_cols else ''
  unknown = [None] * len(runs)
  platforms, recorded = runs.get('platform', unknown), runs.get(record.DETERMINISM_COLUMN, unknown)
  det = [run_deterministic(p, v) for p, v in zip(platforms, recorded, strict=True)]
  runs['det'], runs['det_why'] = [d for d, _ in det], [w for _, w in det]
  return Prepared(
    runs=runs,
    units=runs.assign(unit=runs['seed'].where(runs['seeded'], runs['run']))
    .groupby(['arm', 'unit'], sort=False)
    .agg(seed=('seed', 'first'), value=('value', 'mean'), n_runs=('run', 'size'))
    .reset_index()[['arm', 'seed', 'unit', 'value', 'n_runs']],
    replicates=replicate_table(runs[runs['seeded']]),
    excluded=excluded,
    seeded=seeded,
    group_by=group_by,
    metric=metric,
    scale=scale,
    pairing=rules.pairing_columns(frame.columns),
    lattice=lattice(runs, metric, scale),
  )


def identical_arithmetic(prep, arm_a, arm_b):
  """Do the two arms' records give the same effective arithmetic (IDENTICAL_FIELDS)?"""
  runs = prep.runs
  cols = [EFFECTIVE + f for f in IDENTICAL_FIELDS]
  if not all(c in runs for c in cols[:2]):
    return False
  cols = [c for c in cols if c in runs]
  values = [
    runs.loc[runs['arm'] == arm, cols].astype(str).drop_duplicates() for arm in (arm_a, arm_b)
  ]
  return all(len(v) == 1 for v in values) and values[0].iloc[0].equals(values[1].iloc[0])


def determinism(runs, reps):
  """(True/False/None, why) for one arm: recorded determinism."""
  clash = reps[~reps['identical'].astype(bool)]
  if not clash.empty:
    return False, f'seed {clash["seed"].iloc[0]} repeated with a different value'
  known = [d for d in runs['det'] if d is not None]
  why = '; '.join(sorted(set(runs['det_why'])))
  if len(known) < len(runs):
    return None, why + ('; repeated seeds gave identical values' if not reps.empty else '')
  return all(known), why


def arm_table(prep):
  """Raises (naming --group-by) beyond MAX_ARMS arms, before any per-arm work."""
  arms = prep.units['arm'].nunique()
  if arms > MAX_ARMS:
    by = ', '.join(rules.field_name(g) for g in prep.group_by)
    raise ValueError(
      f'--group-by: {arms:,} arms (by {by}), more than this report holds '
      f'({MAX_ARMS} arms at most: up to {MAX_ARMS * (MAX_ARMS - 1) // 2:,} pairs of '
      'tests, minutes); group by fewer or coarser columns'
    )
  rows = []
  for arm, units in prep.units.groupby('arm', sort=True):
    runs = prep.runs[prep.runs['arm'] == arm]
    reps = prep.replicates[prep.replicates['arm'] == arm]
    x = units['value'].to_numpy()
    low, high, method = mean_ci(x)
    seeded = runs[runs['seeded']]
    wsd, wdf = within_sd(seeded['value'], seeded['seed'].astype(str) + '|' + seeded['config'])
    det, why = determinism(runs, reps)
    rows.append(
      {
        'arm': arm,
        **{g: runs[g].iloc[0] for g in prep.group_by},
        'n': len(x),
        'n_runs': len(runs),
        'mean': x.mean(),
        'sd': x.std(ddof=1) if len(x) > 1 else np.nan,
        'ci_low': low,
        'ci_high': high,
        'ci_method': method,
        'within_sd': wsd,
        'within_df': wdf,
        'deterministic': det,
        'determinism': why,
        'seeds': seed_text(units['seed']),
      }
    )
  return pd.DataFrame(rows)


def design(prep, arm_a, arm_b):
  """(paired, shared seeds, why): paired when 2+ shared seeds share their pairing fields."""
  if not prep.seeded:
    return False, [], 'unpaired: no seed column, each row is its own run'
  units = prep.units
  seeds_a = set(units.loc[units['arm'] == arm_a, 'seed'].dropna())
  seeds_b = set(units.loc[units['arm'] == arm_b, 'seed'].dropna())
  shared = sorted(seeds_a & seeds_b, key=seed_key)
  if len(shared) < 2:
    why = 'unpaired: no shared seeds' if not shared else 'unpaired: 1 shared seed, 2 needed'
    return False, shared, why
  runs = prep.runs
  both = runs[runs['arm'].isin([arm_a, arm_b]) & runs['seed'].isin(shared)]
  values = both[prep.pairing].astype(str).groupby(both['seed']).nunique()
  differ = [c for c in prep.pairing if (values[c] > 1).any()]
  if differ:
    return False, shared, f'unpaired: pairing fields differ: {", ".join(differ)}'
  how = (
    'same init and data order'
    if prep.pairing
    else 'same seed taken as same init and data order (no pairing fields recorded)'
  )
  left = len(seeds_a | seeds_b) - len(shared)
  rest = f'; {left} unshared seed(s) left out of the paired tests' if left else ''
  rest += f'; only {len(shared)} shared: {len(shared) - 1} df' if len(shared) < 3 else ''
  return True, shared, f'paired: {len(shared)} shared seeds, {how}{rest}'


def compare(prep, arm_a, arm_b, margin):
  """Every test of one pair of arms (a dict of pair_table's columns, before Holm)."""
  units = prep.units
  a = units.loc[units['arm'] == arm_a, 'value'].to_numpy()
  b = units.loc[units['arm'] == arm_b, 'value'].to_numpy()
  is_paired, shared, why = design(prep, arm_a, arm_b)
  t, df, p = welch(a, b)
  row = {
    'arm_a': arm_a,
    'arm_b': arm_b,
    'n_a': len(a),
    'n_b': len(b),
    'paired': is_paired,
    'design': why,
    'n_pairs': len(shared) if is_paired else 0,
    'welch_t': t,
    'welch_df': df,
    'welch_p': p,
    **dict.fromkeys(('paired_t', 'paired_p', 'mw_u', 'mw_p'), np.nan),
    'mw_method': 'not used (paired)',
    **dict.fromkeys(('signed_rank_w', 'signed_rank_p'), np.nan),
    'signed_rank_method': 'not used (unpaired)',
    **dict.fromkeys(('hedges_g', 'd_z'), np.nan),
    'identical': False,
  }
  if is_paired:
    by_seed = units.set_index('seed')
    xa, xb = (by_seed[by_seed['arm'] == x].loc[shared, 'value'].to_numpy() for x in (arm_a, arm_b))
    d, n = xa - xb, len(shared)
    row['paired_t'], df, row['paired_p'] = paired(xa, xb)
    row['signed_rank_w'], row['signed_rank_p'], row['signed_rank_method'] = signed_rank(d)
    row.update(
      rank_test='signed-rank',
      rank_p=row['signed_rank_p'],
      d_z=d_z(d),
      identical=bool(np.all(d == 0)) and identical_arithmetic(prep, arm_a, arm_b),
    )
    sd = spread_sd(d)
    se = sd / np.sqrt(n)
    row.update(diff=d.mean(), test='paired t', test_p=row['paired_p'], power_from=f'{n} pairs')
  else:
    row['mw_u'], row['mw_p'], row['mw_method'] = mann_whitney(a, b)
    row.update(rank_test='Mann–Whitney', rank_p=row['mw_p'], hedges_g=hedges_g(a, b))
    se, df = welch_se_df(a, b)
    sd = np.sqrt(
      ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2)
    )
    n = min(len(a), len(b))
    what = 'seeds' if prep.seeded else 'runs'
    row.update(
      diff=a.mean() - b.mean(), test='Welch t', test_p=p, power_from=f'{len(a)} + {len(b)} {what}'
    )
  row['power_sd'], row['power_n'] = sd, n
  row['ci95_low'], row['ci95_high'] = diff_ci(row['diff'], se, df, 1 - ALPHA)
  row['ci90_low'], row['ci90_high'], row['tost_p'] = tost(row['diff'], se, df, margin)
  row['power_diff'], row['power_equiv'] = power_at(sd, margin, n, is_paired)
  row['n80_diff'], row['n80_equiv'] = seeds_needed(sd, margin, is_paired)
  row['lattice'] = prep.lattice
  return row


def judge(rows, margin):
  """The pair table of compare() rows judged as one family at ±`margin`."""
  pairs = pd.DataFrame(rows)
  if pairs.empty:
    return pairs
  tested = ~pairs['identical'].astype(bool)
  for test in ('welch', 'paired', 'tost', 'mw', 'signed_rank', 'rank', 'test'):
    pairs[f'{test}_p_holm'] = holm(pairs[f'{test}_p'].where(tested))
  pairs['equivalent_raw'] = (pairs['tost_p'] < ALPHA) & tested
  pairs['equivalent'] = pairs['tost_p_holm'] < ALPHA
  on_lattice = pairs['lattice'].notna()
  pairs['different'] = (
    (pairs['test_p_holm'] < ALPHA)
    & ((pairs['ci95_low'] > 0) | (pairs['ci95_high'] < 0))
    & (~on_lattice | (pairs['rank_p_holm'] < ALPHA))
  )
  beyond = (pairs['ci90_low'] > margin) | (pairs['ci90_high'] < -margin)
  pairs['verdict'] = np.select(
    [~tested, pairs['equivalent'] & pairs['different'], pairs['equivalent'], pairs['different']]
    + [beyond],
    ['identical arithmetic', 'within margin', 'equivalent', 'different', 'not equivalent'],
    'inconclusive',
  )
  return pairs


def family_size(table):
  """The number of comparisons Holm adjusts over: the judged ones but identical arithmetic."""
  return int((table['verdict'] != 'identical arithmetic').sum()) if not table.empty else 0


def pair_table(prep, arms, margin):
  """One row per pair of arms with n >= 2 (arm_a before arm_b; diff = mean A − mean B)."""
  ok = arms.loc[arms['n'] >= 2, 'arm']
  return judge([compare(prep, a, b, margin) for a, b in itertools.combinations(ok, 2)], margin)


def margin_choice(margin=None, reason=None, declared=None, declared_reason=None):
  """(margin, reason text): the study's declared margin unless `margin`."""
  if reason is not None and (problem := declaration.text_problem(reason)):
    raise ValueError(f'--margin-reason: {problem}')
  if reason is not None and margin is None:
    raise ValueError('--margin-reason: given without --margin; give the margin it explains too')
  if margin is not None:
    margin = declaration.check_margin(margin, '--margin')
  if declared is not None:
    declared = declaration.check_margin(
      declared, "the study's declared margin (study.json or get_study(): margin)"
    )
  if margin is None and declared is None:
    return DEFAULT_MARGIN, UNDECLARED
  if margin is None or margin == declared:
    return declared, declared_reason or 'the study declares it without a reason'
  text = f'from --margin: {reason or "no reason given"}'
  if declared is not None:
    text += f'; the study declares {declared:g} pp: {declared_reason or "no reason given"}'
  return margin, text


def arms_and_pairs(
  frame,
  group_by=(),
  metric=DEFAULT_METRIC,
  margin=DEFAULT_MARGIN,
  margin_reason=None,
  seed_col=None,
  scale=None,
  all_pairs=True,
):
  """The Stats of the runs: prepare's, the arm table and (`all_pairs`) every pair judged."""
  if not margin > 0:
    raise ValueError(f'--margin: must be a positive number of percentage points, got {margin}')
  prep = prepare(frame, list(group_by), metric, seed_col, scale)
  arms = arm_table(prep)
  return Stats(
    **vars(prep),
    arms=arms,
    pairs=pair_table(prep, arms, margin) if all_pairs else pd.DataFrame(),
    small=arms[arms['n'] < 2],
    margin=margin,
    margin_reason=margin_reason or 'no reason given',
    unit='pp' if prep.scale == 100 or is_accuracy(prep.metric) else 'units',
  )


def factor_columns(runs, declared):
  """{factor: column} of the declared factors other than platform."""
  factors = [f for f in declared.get('factors') or [] if f != 'platform']
  if not factors:
    raise ValueError('--study: the declaration names no factors; add factors to get_study()')
  return {f: resolve_column(runs, f, '--study (factors)') for f in factors}


def matches(levels, wanted):
  """Do the arm's levels equal every level of `wanted` ({factor: level}) that it has?"""
  wanted = {f: declaration.level_text(v) for f, v in (wanted or {}).items() if f in levels}
  return bool(wanted) and all(levels[f] == v for f, v in wanted.items())


def arm_levels(out, declared):
  """One row per arm of arms_and_pairs's `out`: arm, platform, each factor's level."""
  runs = out.runs
  columns = factor_columns(runs, declared)
  first = runs.groupby('arm', sort=False).first()
  n = out.arms.set_index('arm')['n']
  rows = []
  for arm, r in first.iterrows():
    levels = {f: declaration.level_text(r[c]) for f, c in columns.items()}
    role = (
      'reference'
      if matches(levels, declared.get('reference'))
      else 'noise'
      if matches(levels, declared.get('noise_arm'))
      else 'arm'
    )
    differ = [
      i
      for i, f in enumerate(columns)
      if levels[f] != declaration.level_text((declared.get('reference') or {}).get(f))
    ]
    rows.append(
      {
        'arm': arm,
        'platform': str(r['platform']) if 'platform' in r else '',
        **levels,
        'label': declaration.arm_label(declared, levels),
        'role': role,
        'n': n[arm],
        'order': ({'reference': -1, 'noise': len(columns)}.get(role, min(differ or [0]))),
      }
    )
  table = pd.DataFrame(rows).sort_values(['platform', 'order', 'label'], kind='stable')
  clash = table[table.duplicated(['platform', 'label'], keep=False)]
  if not clash.empty:
    a, b = clash['arm'].iloc[:2]
    la, lb = (clash.iloc[i][list(columns)].to_dict() for i in (0, 1))
    if la != lb:  # the declaration's labels, not its factors, made them one
      differ = ', '.join(f'{f}={la[f]} and {lb[f]}' for f in columns if la[f] != lb[f])
      raise ValueError(
        f'--study: labels: arms {a!r} and {b!r} differ in {differ} but are both labelled '
        f'{clash["label"].iloc[0]!r}; give each level its own label'
      )
    raise ValueError(
      f'--study: arms {a!r} and {b!r} ({len(clash)} arms in all) have the same declared '
      'factor levels on one platform; declare the factor that separates them '
      '(get_study factors) or --group-by only the declared ones'
    )
  for key in ('reference', 'noise_arm', 'noise_of'):  # each names one arm per platform
    hit = table[
      [matches(r[list(columns)].to_dict(), declared.get(key)) for _, r in table.iterrows()]
    ]
    several = hit[hit.duplicated('platform', keep=False)]
    several = (
      several[several['platform'] == several['platform'].iloc[0]] if len(several) else several
    )
    if not several.empty:
      unnamed = [f for f in columns if f not in (declared.get(key) or {}) and f != 'platform']
      raise ValueError(
        f'--study: {key} matches {len(several)} arms on {several["platform"].iloc[0]} '
        f'({"; ".join(several["label"])}); give its level of {", ".join(unnamed)} too'
      )
    if key == 'noise_of' and hit['role'].eq('noise').any():
      raise ValueError(
        '--study: noise_of names the noise arm itself; name the arm the noise perturbs '
        '(the reference, or the emulation it is added to)'
      )
  return table.reset_index(drop=True)


def family(arms):
  """[(arm, reference arm)] of the declared contrasts, in platform and arm order."""
  pairs = []
  for _, group in arms.groupby('platform', sort=False):
    ref = group[group['role'] == 'reference']
    if len(ref) == 1 and ref['n'].iloc[0] >= 2:
      pairs += [
        (a, ref['arm'].iloc[0])
        for a in group.loc[(group['role'] != 'reference') & (group['n'] >= 2), 'arm']
      ]
  return pairs


def contrast_table(out, declared):
  """The declared contrasts judged as one family (compare rows + judge) with platform."""
  arms = out.arm_info
  arms = arm_levels(out, declared) if arms is None else arms
  table = judge([compare(out, a, b, out.margin) for a, b in family(arms)], out.margin)
  if table.empty:
    return table
  info = arms.set_index('arm')
  for col in ('platform', 'label', 'role'):
    table[col] = [info.loc[a, col] for a in table['arm_a']]
  return table


class NoiseFloor(NamedTuple):
  """The paired difference noise arm − the arm it perturbs (`what`) over `n` seeds: its sd and the
  95% half-width of its mean, t(0.975, n − 1) × sd / √n."""

  sd: float
  half: float
  n: int
  what: str


def arm_mask(runs, levels, flag):
  """Rows of `runs` whose factor columns hold `levels` ({factor name: level})."""
  mask = pd.Series(True, index=runs.index)
  for name, level in levels.items():
    col = name if name in runs else resolve_column(runs, name, flag)
    mask &= runs[col].map(declaration.level_text) == declaration.level_text(level)  # 16.0 is 16
  return mask


def noise_floor(runs, arm, base, factors=()):
  """The NoiseFloor of one platform's runs: noise arm `arm` against `base`."""

  def label(levels):
    return ', '.join(f'{k}={v}' for k, v in levels.items())

  noisy_runs = runs[arm_mask(runs, arm, '--noise-arm')]
  noisy = noisy_runs.groupby('seed')['value'].mean()
  named = {k if k in runs else resolve_column(runs, k, '--noise-of') for k in {**base, **arm}}
  same = {
    f: noisy_runs[f].astype(str).iloc[0]
    for f in factors
    if f not in named
    and f in runs
    and f != 'platform'
    and not noisy_runs.empty
    and noisy_runs[f].astype(str).nunique() == 1
  }
  clean_runs = runs[arm_mask(runs, {**base, **same}, '--noise-of')]
  if 'arm' in clean_runs and (clean_runs.groupby('seed')['arm'].nunique() > 1).any():
    raise ValueError(
      f'--noise-of: {label(base)} matches {clean_runs["arm"].nunique()} arms on one '
      'seed; name every factor of the arm the noise arm perturbs'
    )
  clean = clean_runs.groupby('seed')['value'].mean()
  d = (noisy - clean).dropna().to_numpy()
  if len(d) < 2:
    raise ValueError(
      f'--noise-arm: {label(arm)} shares {len(d)} seed(s) with {label(base)}; it needs 2 or more'
    )
  sd = spread_sd(d)
  half = float(sps.t.ppf(0.975, len(d) - 1) * sd / np.sqrt(len(d)))
  levels = {**base, **same}  # the base arm's levels; the noise arm's other levels are the same
  changed = [k for k in arm if k not in levels or str(levels[k]) != str(arm[k])]
  common = {k: v for k, v in levels.items() if k not in changed}
  what = (
    f'{label({k: arm[k] for k in changed})} − '
    f'{label({k: levels[k] for k in changed if k in levels})}'
    + (f' at {label(common)}' if common else '')
  )
  return NoiseFloor(sd, half, len(d), what)


def noise_floors(runs, arm, base, factors=()):
  """{platform: NoiseFloor} of each platform where the noise arm and its base share 2+ seeds."""
  if not arm:
    return {}
  platforms = (
    runs['platform'].astype(str) if 'platform' in runs else pd.Series('', index=runs.index)
  )
  floors = {}
  for platform, group in runs.groupby(platforms, sort=True):
    try:
      floors[platform] = noise_floor(group, arm, base, factors)
    except ValueError as e:
      if '--noise-of' in str(e) and 'matches' in str(e):
        raise
  return floors


def arm_short_labels(out):
  """{arm: short label}: the declaration's ('gpu: bf16 activations' with several platforms)."""
  if out.arm_info is not None:
    info = out.arm_info
    several = info['platform'].nunique() > 1
    return {r.arm: f'{r.platform}: {r.label}' if several else r.label for r in info.itertuples()}
  return {a: a for a in out.arms['arm']}


@dataclasses.dataclass(frozen=True)
class Scope:
  """Confirmatory (True), exploratory (False) or nothing declared (None), and the deviations."""

  declared_seeds: Optional[list[int]]
  declared_margin: Optional[float]
  analysed_seeds: list[int]
  margin: float
  deviations: list[str]
  declared_seeds_present: bool
  confirmatory: Optional[bool]


def scope(out, declared, compare=None):
  """The Scope of `out`: confirmatory for the declared seeds, margin and platform pairs."""
  m0 = declared.get('margin')
  seeds = sorted({int(x) for x in out.runs['base_seed'].dropna()}) if out.seeded else []
  wanted = declaration.declared_seeds(declared)
  deviations = []
  if wanted is not None and seeds != sorted(wanted):
    deviations.append(
      f'runs on {len(seeds)} seeds ({out.arms["n"].max()} per arm at most), {len(wanted)} '
      f'declared (seeds {seed_text(pd.Series(wanted))})'
    )
  if m0 is not None and out.margin != m0:
    deviations.append(f'margin ±{out.margin:g}, declared ±{m0:g}')
  if compare:
    said = declaration.pairs_text(declared['compare']) if declared.get('compare') else 'every pair'
    deviations.append(
      f'platform pairs {declaration.pairs_text(compare)} from --compare (declared: {said})'
    )
  known = wanted is not None or m0 is not None or bool(compare)
  return Scope(
    declared_seeds=wanted,
    declared_margin=m0,
    analysed_seeds=seeds,
    margin=out.margin,
    deviations=deviations,
    declared_seeds_present=bool(wanted)
    and set(wanted) <= set(seeds)
    and (set(wanted) != set(seeds) or m0 is not None or bool(compare)),
    confirmatory=(not deviations) if known else None,
  )


@dataclasses.dataclass(frozen=True)
class Analysis(Stats):
  """A study's whole analysis (analyse.study_analysis): Stats, its declaration and declared
  contrasts, noise floors, attribution, software, agreement, scope and the confirmatory one."""

  declared: dict[str, Any] = dataclasses.field(default_factory=dict)
  source: str = ''
  contrasts: Optional[pd.DataFrame] = None
  arm_info: Optional[pd.DataFrame] = None
  noise: dict[str, NoiseFloor] = dataclasses.field(default_factory=dict)
  attribution: Optional['Attribution'] = None
  software: Optional[Software] = None
  agreement: Optional['Agreement'] = None
  scope: Optional[Scope] = None
  confirmatory: Optional['Analysis'] = None


def seed_columns(runs):
  """(init column, data column) the runs table records (SEED, else config.SEED), or None."""

  def recorded(seed):
    return next((c for c in (seed, f'config.{seed}') if c in runs and runs[c].notna().any()), None)

  init, data = recorded('init_seed'), recorded('data_seed')
  return (init, data) if init and data else None


def split_by_arm(runs, value='value'):
  """(variance_components per arm whose runs set init and data seeds apart, why a split failed)."""
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
