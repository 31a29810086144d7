"""analysis.stats on planted numbers: verdicts (different, equivalent, inconclusive, Holm),
every statistic against scipy and statsmodels, interval coverage, pairing, the rank tests and
power (no training)."""

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import optimize
from scipy import stats as sps
from statsmodels.stats import multitest, weightstats
from statsmodels.stats import power as smp
from statsmodels.stats.meta_analysis import effectsize_smd

from analysis import analyse, report, stats
from tests.support.planted_stats import frame, why


def tost_ind(a, b, margin):
  """Welch TOST (unequal variances, Welch–Satterthwaite df): (ci90_low, ci90_high, p)."""
  return stats.tost(np.mean(a) - np.mean(b), *stats.welch_se_df(a, b), margin)


def tost_paired(d, margin):
  """Paired TOST on per-seed differences d: (ci90_low, ci90_high, p)."""
  return stats.tost(np.mean(d), np.std(d, ddof=1) / np.sqrt(len(d)), len(d) - 1, margin)


def test_planted_shift_is_different():
  rng = np.random.default_rng(0)
  a, b = 0.70 + rng.normal(0, 0.003, 10), 0.71 + rng.normal(0, 0.003, 10)  # 1 pp shift, sd .3 pp
  out = stats.arms_and_pairs(
    frame({'bfloat16': a, 'float32': b}, {'bfloat16': 'gpu', 'float32': 'gpu'}), margin=0.5
  )
  pair = out.pairs.iloc[0]
  assert out.scale == 100 and pair['diff'] == pytest.approx(100 * (a.mean() - b.mean()))
  assert (
    pair['welch_p_holm'] < 0.001 and pair['signed_rank_p'] < 0.01 and pair['test_p_holm'] < 0.001
  )
  assert pair['rank_test'] == 'signed-rank' and np.isnan(pair['mw_p'])  # paired: no Mann–Whitney
  assert not pair['equivalent'] and pair['tost_p'] > 0.5
  assert pair['ci90_high'] < -0.5 and pair['ci95_high'] < 0  # the whole interval is outside
  assert pair['verdict'] == 'different' and 'excludes 0' in why(pair, 0.5)


def test_identical_distributions_are_equivalent_and_not_different():
  rng = np.random.default_rng(1)
  a, b = 0.70 + rng.normal(0, 0.001, 20), 0.70 + rng.normal(0, 0.001, 20)  # sd .1 pp, no shift
  out = stats.arms_and_pairs(frame({'x': a, 'y': b}, {'x': 'gpu', 'y': 'gpu'}), margin=0.2)
  pair = out.pairs.iloc[0]
  assert pair['welch_p'] > 0.05 and pair['equivalent'] and pair['tost_p_holm'] < 0.05
  assert -0.2 < pair['ci90_low'] < pair['ci90_high'] < 0.2
  assert pair['verdict'] == 'equivalent' and 'within ±0.2 pp' in why(pair, 0.2)
  same = stats.arms_and_pairs(frame({'x': a, 'y': a[::-1]}, {'x': 'gpu', 'y': 'gpu'}), margin=0.2)
  assert same.pairs.iloc[0]['welch_p'] == pytest.approx(1.0)
  assert same.pairs.iloc[0]['verdict'] == 'equivalent'


def test_wide_interval_is_inconclusive():
  rng = np.random.default_rng(6)
  a, b = 0.70 + rng.normal(0, 0.01, 5), 0.70 + rng.normal(0, 0.01, 5)  # sd 1 pp, margin 0.3 pp
  out = stats.arms_and_pairs(frame({'x': a, 'y': b}, {'x': 'gpu', 'y': 'gpu'}), margin=0.3)
  pair = out.pairs.iloc[0]
  assert pair['ci90_low'] < -0.3 and pair['ci90_high'] > 0.3 and pair['test_p_holm'] > 0.05
  assert pair['verdict'] == 'inconclusive'
  assert 'wider than the margin ±0.3 pp on both sides' in why(pair, 0.3)
  assert pair['power_diff'] < 0.8 and pair['n80_equiv'] > 5


def test_holm_can_undo_a_raw_equivalence_and_the_report_shows_both():
  rng = np.random.default_rng(7)
  x = 0.70 + rng.normal(0, 0.002, 8)
  arms = {'x': x, 'y': x + rng.normal(0, 0.001, 8), 'z': x + 0.03}  # z: 3 pp away from both
  d = 100 * (arms['x'] - arms['y'])  # paired on seeds: pick the margin where raw TOST p = 0.03
  margin = optimize.brentq(lambda m: tost_paired(d, m)[2] - 0.03, abs(d.mean()) + 1e-6, 5)
  out = analyse.study_analysis(frame(arms, {k: 'gpu' for k in arms}), margin=margin)
  pair = out.pairs.set_index(['arm_a', 'arm_b']).loc[('compute_dtype=x', 'compute_dtype=y')]
  assert pair['tost_p'] == pytest.approx(0.03) and pair['tost_p_holm'] == pytest.approx(0.09)
  assert pair['equivalent_raw'] and not pair['equivalent'] and pair['verdict'] == 'inconclusive'
  assert 'lies inside' in why(pair, margin, 3) and 'raw 0.030' in why(pair, margin, 3)
  text = report.render(out, 'md')
  assert '| no (raw: yes) | 0.030 (0.090) |' in text and 'Holm-adjusted TOST p < 0.05' in text


def test_every_statistic_equals_scipy_and_statsmodels():
  rng = np.random.default_rng(2)
  a, b = 70 + rng.normal(0, 0.8, 7), 69.5 + rng.normal(0, 0.5, 6)
  t, df, p = stats.welch(a, b)
  sm_t, sm_p, sm_df = weightstats.ttest_ind(a, b, usevar='unequal')
  assert (t, p, df) == pytest.approx((sm_t, sm_p, sm_df))
  low, high, tp = tost_ind(a, b, 0.6)
  assert tp == pytest.approx(weightstats.ttost_ind(a, b, -0.6, 0.6, usevar='unequal')[0])
  cm = weightstats.CompareMeans(weightstats.DescrStatsW(a), weightstats.DescrStatsW(b))
  assert (low, high) == pytest.approx(cm.tconfint_diff(alpha=0.1, usevar='unequal'))
  assert stats.diff_ci(a.mean() - b.mean(), *stats.welch_se_df(a, b), 0.95) == pytest.approx(
    cm.tconfint_diff(alpha=0.05, usevar='unequal')
  )
  x, y = a[:6], b  # paired by position
  low, high, tp = tost_paired(x - y, 0.6)
  assert tp == pytest.approx(weightstats.ttost_paired(x, y, -0.6, 0.6)[0])
  assert (low, high) == pytest.approx(weightstats.DescrStatsW(x - y).tconfint_mean(alpha=0.1))
  assert stats.paired(x, y)[2] == pytest.approx(sps.ttest_rel(x, y).pvalue)
  assert stats.t_ci(a) == pytest.approx(weightstats.DescrStatsW(a).tconfint_mean(alpha=0.05))
  g = stats.hedges_g(a, b)
  assert g == pytest.approx(
    effectsize_smd(a.mean(), a.std(ddof=1), 7, b.mean(), b.std(ddof=1), 6)[0]
  )
  ps = [0.01, np.nan, 0.04, 0.03, 0.2]
  expect = multitest.multipletests([0.01, 0.04, 0.03, 0.2], method='holm')[1]
  assert np.isnan(stats.holm(ps)[1])
  assert stats.holm(ps)[[0, 2, 3, 4]] == pytest.approx(expect)
  # by hand: sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1 = 0.04, 0.09, 0.08, 0.2; the step-down
  # maximum lifts 0.04's to 0.09 (Bonferroni would give 0.16, a step-up Hochberg 0.08)
  assert stats.holm(ps)[[0, 2, 3, 4]] == pytest.approx([0.04, 0.09, 0.09, 0.2])
  rng = np.random.default_rng(0)
  for n in (1, 2, 3, 13, 40):  # ties included: equal to statsmodels bit for bit
    p = rng.uniform(0, 1, n) ** 3
    p[-1] = p[0]
    np.testing.assert_array_equal(stats.holm(p), multitest.multipletests(p, method='holm')[1])
  low, high = stats.bca_ci(a)
  ref = sps.bootstrap(
    (a,),
    np.mean,
    method='BCa',
    n_resamples=stats.BOOTSTRAP_RESAMPLES,
    rng=np.random.default_rng(stats.BOOTSTRAP_SEED),
  ).confidence_interval
  assert (low, high) == pytest.approx((ref.low, ref.high)) and low < a.mean() < high
  groups = [a[:3], a[3:], b]  # pooled within-group sd = sqrt(ANOVA residual mean square)
  values, labels = np.concatenate(groups), np.repeat([0, 1, 2], [3, 4, 6])
  resid = values - pd.Series(values).groupby(labels).transform('mean').to_numpy()
  assert stats.within_sd(values, labels) == pytest.approx((np.sqrt((resid**2).sum() / 10), 10))
  power = smp.TTestPower().power(0.5 / 0.4, 9, 0.05)
  assert stats.power_at(0.4, 0.5, 9, is_paired=True)[0] == pytest.approx(power)


def test_arm_intervals_cover_95_percent():
  """The arm table's intervals at n = 5, 12, 30 (t) and 50 (first BCa size) cover 93–97% of
  normal data sets. 20000 sets per t size: binomial SE 0.15 pp; 2000 for BCa: SE 0.5 pp."""
  rng = np.random.default_rng(8)
  for n, sets in ((5, 20000), (12, 20000), (30, 20000), (stats.BCA_MIN_N, 2000)):
    low, high, method = stats.mean_ci(rng.normal(70, 0.8, (sets, n)))
    assert method == ('t-interval' if n < stats.BCA_MIN_N else 'BCa bootstrap')
    assert 0.93 <= np.mean((low < 70) & (70 < high)) <= 0.97, n


def test_bca_under_covers_where_the_arm_table_does_not_use_it():
  rng = np.random.default_rng(9)
  low, high = stats.bca_ci(rng.normal(0, 1, (2000, 12)))
  assert np.mean((low < 0) & (0 < high)) < 0.92  # the defect: 95% nominal, about 90% actual
  assert stats.ci_method(12) == stats.ci_method(30) == 't-interval'


def test_pairwise_table_matches_direct_calls_and_exact_mann_whitney():
  a, b = np.array([0.70, 0.71, 0.69, 0.72, 0.70]), np.array([0.68, 0.69, 0.70, 0.67, 0.66, 0.69])
  unpaired = frame({'a': a, 'b': b}, {'a': 'gpu', 'b': 'gpu'}).drop(columns='seed')
  out = stats.arms_and_pairs(unpaired, margin=1.0)
  pair = out.pairs.iloc[0]
  assert not pair['paired'] and pair['rank_test'] == 'Mann–Whitney' and np.isnan(pair['d_z'])
  assert pair['welch_p'] == pytest.approx(sps.ttest_ind(100 * a, 100 * b, equal_var=False).pvalue)
  # Exact two-sided Mann–Whitney by enumerating every split of the pooled ranks.
  pooled, u_obs = np.concatenate([a, b]), sps.mannwhitneyu(a, b).statistic
  ranks = sps.rankdata(pooled)
  us = [ranks[list(idx)].sum() - 15 for idx in itertools.combinations(range(11), 5)]
  mean_u = 15
  p_exact = np.mean([abs(u - mean_u) >= abs(u_obs - mean_u) - 1e-9 for u in us])
  assert pair['mw_u'] == u_obs and pair['mw_p'] == pytest.approx(p_exact)
  arm = out.arms.set_index('arm').loc['compute_dtype=a']
  assert (arm['n'], arm['mean'], arm['sd']) == pytest.approx(
    (5, 100 * a.mean(), 100 * a.std(ddof=1))
  )
  assert (arm['ci_low'], arm['ci_high']) == pytest.approx(
    sps.t.interval(0.95, 4, 100 * a.mean(), 100 * sps.sem(a))
  )


def test_three_runs_per_arm_cannot_reach_significance_with_exact_mann_whitney():
  out = stats.arms_and_pairs(
    frame({'a': [0.1, 0.2, 0.3], 'b': [0.7, 0.8, 0.9]}, {'a': 'gpu', 'b': 'gpu'}).drop(
      columns='seed'
    )
  )
  assert out.pairs.iloc[0]['mw_p'] == pytest.approx(0.1)  # 2 / C(6, 3): the smallest possible


def test_seeds_needed_matches_statsmodels_and_monte_carlo():
  # 0.2 pp difference / equivalence, 80% power: 6 at sd .1, 17-18 at .2, 37-40 at .3.
  assert stats.seeds_needed(0.1, 0.2)[0] == 6
  assert stats.seeds_needed(0.2, 0.2) == (17, 18)
  assert 37 <= stats.seeds_needed(0.3, 0.2)[0] <= stats.seeds_needed(0.3, 0.2)[1] <= 40
  n = smp.TTestIndPower().solve_power(effect_size=2 / 3, alpha=0.05, power=0.8)
  assert stats.seeds_needed(0.3, 0.2)[0] == int(np.ceil(n))
  n = smp.TTestPower().solve_power(effect_size=2 / 3, alpha=0.05, power=0.8)
  assert stats.seeds_needed(0.3, 0.2, is_paired=True)[0] == int(np.ceil(n))
  # Monte Carlo: with n_equiv seeds per arm and no true difference, TOST succeeds ~80% of the time.
  n_eq = stats.seeds_needed(0.2, 0.2)[1]
  rng = np.random.default_rng(3)
  x, y = rng.normal(0, 0.2, (4000, n_eq)), rng.normal(0, 0.2, (4000, n_eq))
  se = np.sqrt(x.var(1, ddof=1) / n_eq + y.var(1, ddof=1) / n_eq)
  hit = np.abs(x.mean(1) - y.mean(1)) + sps.t.ppf(0.95, 2 * n_eq - 2) * se < 0.2
  assert 0.77 < hit.mean() < 0.88
  assert stats.power_at(0.2, 0.2, n_eq)[1] == pytest.approx(hit.mean(), abs=0.03)


def test_nondeterministic_arm_pairs_with_deterministic_one_on_shared_seeds():
  rng = np.random.default_rng(4)
  base = 0.7 + rng.normal(0, 0.01, 8)
  values = {'a': base, 'b': base + 0.001 + rng.normal(0, 0.0002, 8)}
  runs = frame(values, {'a': 'tpu', 'b': 'gpu'}, {'b': False})
  out = stats.arms_and_pairs(runs, margin=0.5)
  shuffled = stats.arms_and_pairs(
    runs.iloc[::-1], margin=0.5
  )  # pairs are by seed, not by row order
  for o in (out, shuffled):
    pair = o.pairs.iloc[0]
    assert (
      pair['paired']
      and pair['n_pairs'] == 8
      and pair['design'].startswith('paired: 8 shared seeds')
    )
    assert pair['paired_p'] == pytest.approx(
      sps.ttest_rel(100 * values['b'], 100 * values['a']).pvalue
    )
    assert pair['paired_p'] < 0.001 < pair['welch_p']  # seed variance removed by pairing
    assert pair['verdict'] == 'within margin'  # shown (p < 0.001), and inside ±0.5 pp
  assert list(out.arms['deterministic']) == [False, True]  # gpu (recorded False), tpu
  runs['config.batch_size'] = np.where(runs['platform'] == 'gpu', 256, 512)
  pair = stats.arms_and_pairs(runs, margin=0.5).pairs.iloc[0]
  assert (
    not pair['paired'] and pair['design'] == 'unpaired: pairing fields differ: config.batch_size'
  )
  runs['seed'] = np.where(runs['platform'] == 'gpu', runs['seed'] + 100, runs['seed'])
  pair = stats.arms_and_pairs(runs, margin=0.5).pairs.iloc[0]
  assert not pair['paired'] and pair['design'] == 'unpaired: no shared seeds'


def test_signed_rank_equals_scipys_exact_test_with_ties_and_zeros():
  rng = np.random.default_rng(5)
  for n in (6, 9, 12):
    d = rng.integers(-3, 4, size=n) * 0.278  # accuracy on 360 images: ties and zeros
    w, p, method = stats.signed_rank(d)
    nonzero = d[d != 0]
    ref = sps.wilcoxon(nonzero, method=sps.PermutationMethod(n_resamples=np.inf))
    assert (w, p) == pytest.approx((ref.statistic, ref.pvalue)) and method.startswith('exact')
  assert stats.signed_rank(np.zeros(5))[1] == 1.0


def test_paired_pairs_get_signed_rank_and_d_z_unpaired_ones_mann_whitney_and_g():
  rng = np.random.default_rng(6)
  a = 0.9 + rng.normal(0, 0.01, 8)
  b = a - 0.004 + rng.normal(0, 0.002, 8)
  pair = stats.arms_and_pairs(frame({'x': a, 'y': b}), margin=0.5).pairs.iloc[0]
  d = 100 * (a - b)
  assert pair['paired'] and pair['d_z'] == pytest.approx(d.mean() / d.std(ddof=1))
  assert pair['signed_rank_p'] == pytest.approx(sps.wilcoxon(d).pvalue)  # exact, no ties here
  # the unpaired effect size of the same data is far smaller: the seed spread stays in it
  assert abs(stats.hedges_g(100 * a, 100 * b)) < abs(pair['d_z']) / 3


def test_power_is_a_number_where_statsmodels_returns_nan():
  from statsmodels.stats import power as smp

  assert np.isnan(smp.TTestPower().power(2 / 0.76, 16, 0.05))  # the case the report showed as "–"
  power, _ = stats.power_at(0.76, 2.0, 16, is_paired=True)
  assert power == pytest.approx(1.0, abs=1e-9)
  assert stats.nct_power(0.5, 16, True) == pytest.approx(smp.TTestPower().power(0.5, 16, 0.05))


def lattice_frame(diffs_in_images, n_seeds, test_size=360):
  """Two paired arms on one platform whose per-seed accuracies differ by the given image counts."""
  rng = np.random.default_rng(8)
  base = 0.9 + rng.integers(-5, 5, n_seeds) / test_size
  other = base - np.resize(diffs_in_images, n_seeds) / test_size
  return frame({'x': base, 'y': other}).assign(**{'data.test_size': test_size})


def test_on_a_lattice_a_different_verdict_needs_the_rank_test_too():
  """Six seeds whose differences are one or two test images: the paired t is small (p 0.0015), but
  the exact signed-rank p cannot go below 2 / 2^6 = 0.031; with several comparisons in the family
  Holm lifts it past 0.05, so 'different' rests on the t-test alone and is not given."""
  out = stats.arms_and_pairs(lattice_frame([1, 1, 2, 1, 1, 2], 6), margin=0.2)
  pair = out.pairs.iloc[0]
  assert pair['lattice'] == pytest.approx(100 / 360) and pair['paired_p'] < 0.01
  assert pair['signed_rank_p'] == pytest.approx(2 / 64)
  rows = [stats.compare(out, *out.pairs.iloc[0][['arm_a', 'arm_b']], 0.2)] * 3
  judged = stats.judge(rows, 0.2)
  assert (judged['test_p_holm'] < 0.05).all() and not judged['different'].any()
  off = [dict(r, lattice=None) for r in rows]  # the same numbers off a lattice: 'different'
  assert stats.judge(off, 0.2)['different'].all()


def test_identical_arithmetic_is_reported_not_tested_and_outside_holm():
  rng = np.random.default_rng(9)
  a = 0.9 + rng.normal(0, 0.01, 6)
  table = frame(
    {'native': a, 'f32': a, 'bf16': a + rng.normal(0, 0.005, 6)},
    {'native': 'cpu', 'f32': 'cpu', 'bf16': 'cpu'},
  )
  effective = {'native': 'f32', 'f32': 'f32', 'bf16': 'bf16'}
  table = table.assign(
    **{
      'numerics.effective.platform': 'cpu',
      'numerics.effective.device_kind': 'cpu',
      'numerics.effective.conv_format': table['numerics.requested.compute_dtype'].map(effective),
    }
  )
  pairs = stats.arms_and_pairs(table, margin=0.5).pairs.set_index(['arm_a', 'arm_b'])
  same = pairs.loc[('compute_dtype=f32', 'compute_dtype=native')]
  assert same['verdict'] == 'identical arithmetic' and np.isnan(same['tost_p_holm'])
  tested = pairs[pairs['verdict'] != 'identical arithmetic']
  assert len(tested) == 2
  np.testing.assert_allclose(tested['tost_p_holm'], stats.holm(tested['tost_p']))
  # equal values without equal recorded arithmetic are tested like any pair
  plain = stats.arms_and_pairs(
    frame({'native': a, 'f32': a}, {'native': 'cpu', 'f32': 'cpu'}), margin=0.5
  )
  assert plain.pairs.iloc[0]['verdict'] == 'equivalent'
