"""The statistical tests and intervals behind analysis.numbers.stats, each checked against
scipy/statsmodels.

Intervals of an arm's mean: the Student t-interval below BCA_MIN_N values, the BCa bootstrap from
there on, and the t-interval again from BCA_MAX_N. The BCa interval under-covers at small n
(simulated, normal data, nominal 95%, 1000 to 3000 data sets per n: 90% at n = 12, 92% at n = 20,
93–94% at n = 30, 94–95% at n = 50); the t-interval is exact for normal data at every n
(tests/unit/test_stats.py checks both). At large n the two agree (at n = 5,000 their endpoints
differed by about 1% of the interval's width, normal and lognormal data) while the bootstrap's cost
grows as n^2 (its jackknife): 1.1 s at 5,000 values, 2.5 s at 10,000, 6 s at 25,000 on a 2-core CPU.
Differences: Welch (unpaired) or paired t; equivalence by TOST (two one-sided t-tests).
Paired designs: Wilcoxon's signed-rank test (signed_rank: scipy.stats.wilcoxon, zeros dropped
(Wilcox), exact over every sign flip of the ranks (ties kept as midranks) up to
SIGNED_RANK_EXACT_MAX_N nonzero differences, else the normal approximation with tie correction)
and the paired effect size d_z = mean(d) / sd(d). Ratios of paired means (the share of a gap):
Fieller's interval (fieller).
Mann–Whitney, by size (mann_whitney): scipy's exact distribution of U without ties up to
MW_EXACT_MAX_N values per arm (its cost grows as n^3: 0.015 s at 100 x 100, 0.9 s at 200 x 200,
7.6 s at 400 x 400 on a 2-core CPU; 2 x 1,000 did not finish in 300 s); with ties, the exact
permutation test over the midranks where it enumerates at most MW_PERMUTATION_MAX_SPLITS splits;
else the normal approximation with tie and continuity correction (scipy's 'asymptotic').
Reference: docs/statistics.md "Contrasts and verdicts".
"""

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats import power as smp

ALPHA = 0.05
POWER = 0.8
BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 9999
BCA_MIN_N = 50  # below this the arm table uses t-intervals (BCa under-covers, see above)
BCA_MAX_N = 5000  # from this on t-intervals again (they agree with BCa, which costs n^2)
T_METHOD = 't-interval'
BCA_METHOD = 'BCa bootstrap'
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
  """BCa bootstrap interval of the mean along the last axis (scipy.stats.bootstrap, fixed rng).

  1-D x: (low, high) floats, NaN for n < 2, the value itself when all values are equal.
  """
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
  """(low, high) of the mean of per-unit proportions p (fractions in [0, 1], one per independent
  unit, e.g. a churn per seed): the t-Wilson interval, the μ in [0, 1] with
  (p̄ − μ)² ≤ k μ (1 − μ),  k = t²(0.5 + level / 2, m − 1) s² / (m p̄ (1 − p̄)),
  s the sd of p over the m units: Wilson's score interval with the between-unit variance of p̄ in
  place of the binomial one (a quasi-binomial variance, φ μ (1 − μ) / m), so
  (low, high) = (p̄ + k/2 ∓ √(k p̄ (1 − p̄) + k²/4)) / (1 + k).
  It lies in [0, 1], contains p̄, is asymmetric near 0 and 1, and where p̄ is far from both it is
  the t-interval p̄ ± t s / √m (k p̄ (1 − p̄) = t² s² / m). Every unit equal (s = 0), p̄ = 0 or 1:
  the point itself; m < 2: NaN."""
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


def welch(a, b):
  """(t, df, p): two-sided Welch t-test of mean(a) - mean(b)."""
  r = sps.ttest_ind(a, b, equal_var=False)
  return r.statistic, r.df, r.pvalue


def paired(a, b):
  """(t, df, p): two-sided paired t-test of mean(a - b); a and b aligned by seed."""
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
  if se == 0:
    return diff, diff, (0.0 if abs(diff) < margin else 1.0)
  p_low = sps.t.sf((diff + margin) / se, df)
  p_high = sps.t.cdf((diff - margin) / se, df)
  return (*diff_ci(diff, se, df, 1 - 2 * ALPHA), max(p_low, p_high))


def tost_ind(a, b, margin):
  """Welch TOST (unequal variances, Welch–Satterthwaite df): (ci90_low, ci90_high, p)."""
  return tost(np.mean(a) - np.mean(b), *welch_se_df(a, b), margin)


def tost_paired(d, margin):
  """Paired TOST on per-seed differences d: (ci90_low, ci90_high, p)."""
  return tost(np.mean(d), np.std(d, ddof=1) / np.sqrt(len(d)), len(d) - 1, margin)


def mw_method(a, b):
  """The Mann–Whitney method for samples a and b (see the module doc)."""
  pooled = np.concatenate([a, b])
  ties = len(np.unique(pooled)) < len(pooled)
  if not ties and max(len(a), len(b)) <= MW_EXACT_MAX_N:
    return MW_EXACT
  if ties and math.comb(len(pooled), len(a)) <= MW_PERMUTATION_MAX_SPLITS:
    return MW_PERMUTATION
  return MW_NORMAL


def mann_whitney(a, b):
  """(U of a, two-sided p, method): scipy.stats.mannwhitneyu by the method mw_method chooses; the
  permutation test's statistic is |U - n_a n_b / 2| over every split of the pooled values."""
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
  """(W = min(W+, W-), two-sided p, method) of Wilcoxon's signed-rank test of the paired differences
  d (zeros dropped, Wilcox); (nan, 1.0, 'all differences 0') when every difference is 0. Exact up to
  SIGNED_RANK_EXACT_MAX_N nonzero differences: the null distribution of W+ = the sum of the
  positive differences' midranks over all 2^n equally likely sign flips (the exact null with
  ties; scipy's method='exact' ignores ties), counted by dynamic programming over half-ranks, and
  p = min(1, 2 min(P(W+ <= w), P(W+ >= w))) as scipy.stats.wilcoxon with a PermutationMethod
  gives (tests/unit/test_gap.py checks); else scipy's normal approximation with tie correction."""
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


def d_z(d):
  """Paired standardised effect mean(d) / sd(d) (Cohen's d_z); NaN when sd is 0 or n < 2."""
  d = np.asarray(d, float)
  sd = np.std(d, ddof=1) if len(d) > 1 else np.nan
  return float(np.mean(d) / sd) if sd > 0 else np.nan


def fieller(num, den, level=0.95):
  """(s = mean(num) / mean(den), low, high): Fieller's interval for a ratio of paired means, num
  and den aligned per seed. With means n̄, ḡ and their (co)variances v_nn, v_gg, v_ng (sample
  covariance / count), t = t(0.5 + level / 2, count - 1), the interval is the set of s with
  (n̄ - s ḡ)^2 <= t^2 (v_nn - 2 s v_ng + s^2 v_gg): the roots of
  (ḡ^2 - t^2 v_gg) s^2 - 2 (n̄ ḡ - t^2 v_ng) s + (n̄^2 - t^2 v_nn). Bounded exactly when ḡ's own
  t-test rejects 0 at 1 - level (ḡ^2 > t^2 v_gg); otherwise (-inf, inf)."""
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


def delta_ratio(num, den, level=0.95):
  """(s, low, high): the delta-method interval of mean(num) / mean(den) (paired), kept only as the
  nearest wrong version Fieller's is tested against: it under-covers when the denominator's t is
  small (about 82% at t = 2.5)."""
  num, den = np.asarray(num, float), np.asarray(den, float)
  k = len(num)
  s = num.mean() / den.mean()
  se = np.std(num - s * den, ddof=1) / np.sqrt(k) / abs(den.mean())
  half = sps.t.ppf(0.5 + level / 2, k - 1) * se
  return s, s - half, s + half


def hedges_g(a, b):
  """Bias-corrected standardised mean difference (mean(a) - mean(b)) / pooled sd × J."""
  na, nb = len(a), len(b)
  sp = np.sqrt(((na - 1) * np.var(a, ddof=1) + (nb - 1) * np.var(b, ddof=1)) / (na + nb - 2))
  if sp == 0:
    return np.nan
  return (np.mean(a) - np.mean(b)) / sp * (1 - 3 / (4 * (na + nb) - 9))


def holm(pvalues):
  """Holm step-down adjusted p-values; NaN entries stay NaN and do not count as tests.

  By hand (tested against statsmodels' multipletests, which runs gc.collect() on every call:
  0.4 s each here, 5 calls per report).
  """
  p = np.asarray(pvalues, float)
  out = np.full_like(p, np.nan)
  idx = np.flatnonzero(~np.isnan(p))
  order = idx[np.argsort(p[idx], kind='stable')]
  m, running = len(order), 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p[i]))
    out[i] = running
  return out


def within_sd(values, labels):
  """(pooled within-group sd, df) of `values` grouped by `labels` (the replicates of each label);
  df = values - labels; (NaN, 0) with no replicate."""
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


def _solver(is_paired):
  return smp.TTestPower() if is_paired else smp.TTestIndPower()


def nct_power(es, n, is_paired, alternative='two-sided'):
  """Power of a one-sample (paired) or two-sample t-test at effect size es, n per arm (pairs), by
  the noncentral t directly: statsmodels returns NaN at large effect sizes (its root solver),
  where the power is 1 to many digits."""
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
  """(power to detect a true difference of `margin`, power to show equivalence within ±margin
  when the true difference is 0) with n per arm (pairs when paired), α = 0.05; NaN if sd is 0."""
  if not sd > 0 or n < 2:
    return np.nan, np.nan
  es, solver = margin / sd, _solver(is_paired)
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
  """(n for 80% power to detect a difference of `margin`, n for 80% power to show equivalence
  within ±margin when the true difference is 0); per arm (pairs when paired); α = 0.05.

  statsmodels TTestIndPower (TTestPower when paired); equivalence uses the usual TOST
  approximation: both one-sided tests at α, each with power 1 − (1 − 0.8) / 2 against the margin.
  """
  if not sd > 0:
    return 2, 2
  es, solver = margin / sd, _solver(is_paired)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    diff = smallest_n(lambda n: solver.power(es, n, ALPHA), POWER)
    equiv = smallest_n(
      lambda n: solver.power(es, n, ALPHA, alternative='larger'), 1 - (1 - POWER) / 2
    )
  return diff, equiv
