"""analysis.inputs.results, analysis.numbers.stats and the report of analysis.analyse on planted
numbers and fake Orbax runs (no training)."""

import io
import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import optimize
from scipy import stats as sps
from statsmodels.stats import multitest, weightstats
from statsmodels.stats import power as smp
from statsmodels.stats.meta_analysis import effectsize_smd

from analysis import analyse
from analysis.inputs import csv_input, results
from analysis.numbers import answer, inference, stats
from analysis.words import report
from runrecord import record
from tests.support.planted_runs import fake_results

METRIC = 'final.test_accuracy'


def frame(arms, platforms=None, deterministic=None):
  """A runs table: arms = {dtype: [accuracy fraction per seed 0..n-1]}; deterministic = {dtype:
  bool} sets the recorded GPU determinism (runrecord.record.DETERMINISM_COLUMN)."""
  rows = []
  for dtype, values in arms.items():
    platform = (platforms or {}).get(dtype, 'tpu')
    for seed, value in enumerate(values):
      row = {
        'run': f'/r/{dtype}/{seed:03d}',
        'status': 'completed',
        'reason': '',
        'seed': seed,
        'platform': platform,
        'numerics.requested.compute_dtype': dtype,
        METRIC: value,
      }
      if deterministic is not None:
        row[record.DETERMINISM_COLUMN] = deterministic.get(dtype, False)
      rows.append(row)
  return pd.DataFrame(rows)


PUB_SEEDS = [42, 42, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10]  # per platform; 42 and 3 run twice


def published_values():
  """(tpu, gpu): 14 accuracies each (fractions, in PUB_SEEDS order) whose means, sds and Welch p
  are the published ones to 4 decimals: TPU 0.6979 (sd 0.0090), GPU 0.6937 (sd 0.0065), p 0.1734.

  The shapes are fixed normal quantiles (TPU repeats seeds 42 and 3 bit for bit, GPU does not);
  the means move inside their rounding interval until Welch's p is 0.1734.
  """
  order = np.random.default_rng(14).permutation
  z_tpu = sps.norm.ppf((np.arange(12) + 0.5) / 12)[order(12)][
    [0, 0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10, 11]
  ]
  z_gpu = sps.norm.ppf((np.arange(14) + 0.5) / 14)[order(14)]

  def unit(z):
    return (z - z.mean()) / z.std(ddof=1)

  def build(s):
    return (0.6979 - s * 4.9e-5 + 0.0090 * unit(z_tpu), 0.6937 + s * 4.9e-5 + 0.0065 * unit(z_gpu))

  s = optimize.brentq(lambda s: sps.ttest_ind(*build(s), equal_var=False).pvalue - 0.1734, 0, 1)
  return build(s)


def write_published(path, with_seeds):
  tpu, gpu = published_values()
  table = {'platform': ['tpu'] * 14 + ['gpu'] * 14, 'accuracy': np.concatenate([tpu, gpu])}
  if with_seeds:
    table = {'platform': table['platform'], 'seed': PUB_SEEDS * 2, 'accuracy': table['accuracy']}
  pd.DataFrame(table).to_csv(path, index=False)
  return tpu, gpu


def test_published_values_match_the_published_summary():
  tpu, gpu = published_values()
  assert (round(tpu.mean(), 4), round(tpu.std(ddof=1), 4)) == (0.6979, 0.0090)
  assert (round(gpu.mean(), 4), round(gpu.std(ddof=1), 4)) == (0.6937, 0.0065)
  assert round(sps.ttest_ind(tpu, gpu, equal_var=False).pvalue, 4) == 0.1734
  assert tpu[0] == tpu[1] and tpu[5] == tpu[6] and gpu[0] != gpu[1] and gpu[5] != gpu[6]


def csv_tables(text):
  """{table: DataFrame} of what `--format csv` prints ('# name' then the CSV, per table)."""
  blocks = [b for b in text.split('# ') if b.strip()]
  return {b.split('\n', 1)[0]: pd.read_csv(io.StringIO(b.split('\n', 1)[1])) for b in blocks}


def test_two_column_published_csv_reproduces_welch_p(tmp_path, capsys):
  tpu, gpu = write_published(tmp_path / 'published.csv', with_seeds=False)
  analyse.main(
    ['--csv', str(tmp_path / 'published.csv'), '--group-by', 'platform', '--metric', 'accuracy']
  )
  text = capsys.readouterr().out
  assert 'unpaired: no seed column, each row is its own run' in text
  assert 'no seed column: every row is its own run' in text  # the setup says so too
  assert 'not recorded' in text and '| 0.173 (0.173) |' in text  # Welch p, raw (Holm)
  assert 'every pair, Holm over 1' in text  # no declaration: every pair is a comparison
  analyse.main(
    [
      '--csv',
      str(tmp_path / 'published.csv'),
      '--group-by',
      'platform',
      '--metric',
      'accuracy',
      '--format=csv',
    ]
  )
  tables = csv_tables(capsys.readouterr().out)
  pair, arms = tables['pairs'].iloc[0], tables['arms'].set_index('arm')
  assert round(pair['welch_p'], 4) == 0.1734 and not pair['paired'] and pair['test'] == 'Welch t'
  assert list(arms['n']) == [14, 14] and round(arms.loc['tpu', 'mean'], 2) == 69.79
  assert round(arms.loc['gpu', 'sd'], 2) == 0.65 and (arms['ci_method'] == 't-interval').all()
  assert pair['verdict'] == 'inconclusive'  # 90% CI (about −0.92, +0.08) pp crosses −0.5 pp


def test_published_csv_with_seeds_averages_duplicates_and_pairs(tmp_path, capsys):
  tpu, gpu = write_published(tmp_path / 'seeded.csv', with_seeds=True)
  analyse.main(
    [
      '--csv',
      str(tmp_path / 'seeded.csv'),
      '--group-by',
      'platform',
      '--metric',
      'accuracy',
      '--format=csv',
    ]
  )
  tables = csv_tables(capsys.readouterr().out)
  reps = tables['replicates']
  assert sorted(zip(reps['arm'], reps['seed'], reps['n_runs'], strict=True)) == [
    ('gpu', 3, 2),
    ('gpu', 42, 2),
    ('tpu', 3, 2),
    ('tpu', 42, 2),
  ]
  assert list(reps.set_index(['arm', 'seed']).loc[[('tpu', 42), ('gpu', 42)], 'identical']) == [
    True,
    False,
  ]

  def per_seed(x):
    return pd.Series(100 * x).groupby(PUB_SEEDS).mean()  # replicates averaged

  a, b = per_seed(gpu), per_seed(tpu)
  arms, pair = tables['arms'].set_index('arm'), tables['pairs'].iloc[0]
  assert list(arms['n']) == [12, 12] and list(arms['n_runs']) == [14, 14]
  assert arms.loc['gpu', 'mean'] == pytest.approx(a.mean())
  within = np.sqrt(((100 * (gpu[0] - gpu[1])) ** 2 + (100 * (gpu[5] - gpu[6])) ** 2) / 4)
  assert arms.loc['gpu', 'within_sd'] == pytest.approx(within) and arms.loc['tpu', 'within_sd'] == 0
  assert not arms.loc['gpu', 'deterministic'] and pair['paired'] and pair['n_pairs'] == 12
  assert pair['paired_p'] == pytest.approx(sps.ttest_rel(a, b).pvalue)
  assert pair['diff'] == pytest.approx((a - b).mean()) and pair['test'] == 'paired t'
  assert 'paired: 12 shared seeds' in pair['design'] and pair['power_from'] == '12 pairs'


def why(pair, margin, m=1):
  """The report's words for a judged pair (analysis/words/report.py): stats keeps numbers only."""
  return report.verdict_why(pair, margin, 'pp', m)


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
  margin = optimize.brentq(lambda m: inference.tost_paired(d, m)[2] - 0.03, abs(d.mean()) + 1e-6, 5)
  out = answer.study_analysis(frame(arms, {k: 'gpu' for k in arms}), margin=margin)
  pair = out.pairs.set_index(['arm_a', 'arm_b']).loc[('compute_dtype=x', 'compute_dtype=y')]
  assert pair['tost_p'] == pytest.approx(0.03) and pair['tost_p_holm'] == pytest.approx(0.09)
  assert pair['equivalent_raw'] and not pair['equivalent'] and pair['verdict'] == 'inconclusive'
  assert 'lies inside' in why(pair, margin, 3) and 'raw 0.030' in why(pair, margin, 3)
  text = report.render(out, 'md')
  assert '| no (raw: yes) | 0.030 (0.090) |' in text and 'Holm-adjusted TOST p < 0.05' in text


def test_every_statistic_equals_scipy_and_statsmodels():
  rng = np.random.default_rng(2)
  a, b = 70 + rng.normal(0, 0.8, 7), 69.5 + rng.normal(0, 0.5, 6)
  t, df, p = inference.welch(a, b)
  sm_t, sm_p, sm_df = weightstats.ttest_ind(a, b, usevar='unequal')
  assert (t, p, df) == pytest.approx((sm_t, sm_p, sm_df))
  low, high, tp = inference.tost_ind(a, b, 0.6)
  assert tp == pytest.approx(weightstats.ttost_ind(a, b, -0.6, 0.6, usevar='unequal')[0])
  cm = weightstats.CompareMeans(weightstats.DescrStatsW(a), weightstats.DescrStatsW(b))
  assert (low, high) == pytest.approx(cm.tconfint_diff(alpha=0.1, usevar='unequal'))
  assert inference.diff_ci(
    a.mean() - b.mean(), *inference.welch_se_df(a, b), 0.95
  ) == pytest.approx(cm.tconfint_diff(alpha=0.05, usevar='unequal'))
  x, y = a[:6], b  # paired by position
  low, high, tp = inference.tost_paired(x - y, 0.6)
  assert tp == pytest.approx(weightstats.ttost_paired(x, y, -0.6, 0.6)[0])
  assert (low, high) == pytest.approx(weightstats.DescrStatsW(x - y).tconfint_mean(alpha=0.1))
  assert inference.paired(x, y)[2] == pytest.approx(sps.ttest_rel(x, y).pvalue)
  assert inference.t_ci(a) == pytest.approx(weightstats.DescrStatsW(a).tconfint_mean(alpha=0.05))
  g = inference.hedges_g(a, b)
  assert g == pytest.approx(
    effectsize_smd(a.mean(), a.std(ddof=1), 7, b.mean(), b.std(ddof=1), 6)[0]
  )
  ps = [0.01, np.nan, 0.04, 0.03, 0.2]
  expect = multitest.multipletests([0.01, 0.04, 0.03, 0.2], method='holm')[1]
  assert np.isnan(inference.holm(ps)[1])
  assert inference.holm(ps)[[0, 2, 3, 4]] == pytest.approx(expect)
  low, high = inference.bca_ci(a)
  ref = sps.bootstrap(
    (a,),
    np.mean,
    method='BCa',
    n_resamples=inference.BOOTSTRAP_RESAMPLES,
    rng=np.random.default_rng(inference.BOOTSTRAP_SEED),
  ).confidence_interval
  assert (low, high) == pytest.approx((ref.low, ref.high)) and low < a.mean() < high
  groups = [a[:3], a[3:], b]  # pooled within-group sd = sqrt(ANOVA residual mean square)
  values, labels = np.concatenate(groups), np.repeat([0, 1, 2], [3, 4, 6])
  resid = values - pd.Series(values).groupby(labels).transform('mean').to_numpy()
  assert inference.within_sd(values, labels) == pytest.approx((np.sqrt((resid**2).sum() / 10), 10))
  power = smp.TTestPower().power(0.5 / 0.4, 9, 0.05)
  assert inference.power_at(0.4, 0.5, 9, is_paired=True)[0] == pytest.approx(power)


def test_arm_intervals_cover_95_percent():
  """The arm table's intervals at n = 5, 12, 30 (t) and 50 (first BCa size) cover 93–97% of
  normal data sets. 20000 sets per t size: binomial SE 0.15 pp; 2000 for BCa: SE 0.5 pp."""
  rng = np.random.default_rng(8)
  for n, sets in ((5, 20000), (12, 20000), (30, 20000), (inference.BCA_MIN_N, 2000)):
    low, high, method = inference.mean_ci(rng.normal(70, 0.8, (sets, n)))
    assert method == ('t-interval' if n < inference.BCA_MIN_N else 'BCa bootstrap')
    assert 0.93 <= np.mean((low < 70) & (70 < high)) <= 0.97, n


def test_bca_under_covers_where_the_arm_table_does_not_use_it():
  rng = np.random.default_rng(9)
  low, high = inference.bca_ci(rng.normal(0, 1, (2000, 12)))
  assert np.mean((low < 0) & (0 < high)) < 0.92  # the defect: 95% nominal, about 90% actual
  assert inference.ci_method(12) == inference.ci_method(30) == 't-interval'


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
  assert inference.seeds_needed(0.1, 0.2)[0] == 6
  assert inference.seeds_needed(0.2, 0.2) == (17, 18)
  assert 37 <= inference.seeds_needed(0.3, 0.2)[0] <= inference.seeds_needed(0.3, 0.2)[1] <= 40
  n = smp.TTestIndPower().solve_power(effect_size=2 / 3, alpha=0.05, power=0.8)
  assert inference.seeds_needed(0.3, 0.2)[0] == int(np.ceil(n))
  n = smp.TTestPower().solve_power(effect_size=2 / 3, alpha=0.05, power=0.8)
  assert inference.seeds_needed(0.3, 0.2, is_paired=True)[0] == int(np.ceil(n))
  # Monte Carlo: with n_equiv seeds per arm and no true difference, TOST succeeds ~80% of the time.
  n_eq = inference.seeds_needed(0.2, 0.2)[1]
  rng = np.random.default_rng(3)
  x, y = rng.normal(0, 0.2, (4000, n_eq)), rng.normal(0, 0.2, (4000, n_eq))
  se = np.sqrt(x.var(1, ddof=1) / n_eq + y.var(1, ddof=1) / n_eq)
  hit = np.abs(x.mean(1) - y.mean(1)) + sps.t.ppf(0.95, 2 * n_eq - 2) * se < 0.2
  assert 0.77 < hit.mean() < 0.88
  assert inference.power_at(0.2, 0.2, n_eq)[1] == pytest.approx(hit.mean(), abs=0.03)


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


def test_margin_and_its_reason_are_printed_and_overrides_say_so(tmp_path, capsys):
  assert stats.margin_choice(None, None, 0.5, 'one test image is 0.28 pp') == (
    0.5,
    'one test image is 0.28 pp',
  )
  margin, why = stats.margin_choice(0.3, 'tighter', 0.5, 'one test image is 0.28 pp')
  assert margin == 0.3 and why == (
    'from --margin: tighter; the study declares 0.5 pp: one test image is 0.28 pp'
  )
  assert stats.margin_choice() == (stats.DEFAULT_MARGIN, stats.UNDECLARED)
  write_published(tmp_path / 'p.csv', with_seeds=False)
  analyse.main(['--csv', str(tmp_path / 'p.csv'), '--metric', 'accuracy'])
  assert f'equivalence margin: ±0.5 pp ({stats.UNDECLARED})' in capsys.readouterr().out
  analyse.main(
    [
      '--csv',
      str(tmp_path / 'p.csv'),
      '--metric',
      'accuracy',
      '--margin',
      '0.3',
      '--margin-reason',
      'half the GPU sd',
    ]
  )
  assert 'equivalence margin: ±0.3 pp (from --margin: half the GPU sd)' in capsys.readouterr().out


def make_runs(root):
  """Two GPU arms (float32 deterministic, bfloat16 not) + a duplicate, a failed and a running
  run."""
  for seed in range(4):
    record.write_results(f'{root}/f32/s{seed}', fake_results(seed, 0.80 + 0.001 * seed))
    record.write_results(
      f'{root}/bf16/s{seed}', fake_results(seed, 0.78 + 0.002 * seed, dtype='bfloat16', det=False)
    )
  # same value (deterministic), another run: its own wall time (a copy would be counted once)
  record.write_results(f'{root}/f32/s1_again', {**fake_results(1, 0.801), 'wall_time_s': 2.0})
  record.write_results(f'{root}/bf16/s2_again', fake_results(2, 0.70, dtype='bfloat16', det=False))
  record.write_results(f'{root}/f32/s9', fake_results(9, 0.1, status='failed'))
  record.write_results(f'{root}/f32/s8', fake_results(8, 0.1, status='running', step=3), step=3)
  record.write_results(f'{root}/f32/s7', fake_results(7, 0.1, status='running', step=3), step=3)
  record.write_results(f'{root}/f32/s7', fake_results(7, 0.803, step=10), step=10)  # finished later


def test_orbax_runs_replicates_and_failed_runs(tmp_path):
  make_runs(tmp_path)
  runs, hist = results.load(str(tmp_path))
  assert len(runs) == 13 and list(runs['run']) == sorted(runs['run'])
  assert runs.set_index('run').loc[f'{tmp_path}/f32/s7', 'status'] == 'completed'  # latest step
  assert {
    'numerics.requested.compute_dtype',
    'config.model.width',
    'final.test_loss',
    'config.model.reinit',
  } <= set(runs.columns)
  assert set(hist.columns) >= {'run', 'epoch', 'test_accuracy'} and len(hist) == 26
  out = stats.arms_and_pairs(runs, margin=0.5)
  assert list(out.arms['n']) == [4, 5] and list(out.arms['n_runs']) == [5, 6]
  reps = out.replicates.set_index('seed')
  assert (
    reps.loc[1, 'runs'] == f'{tmp_path}/f32/s1, {tmp_path}/f32/s1_again'
    and reps.loc[1, 'identical']
  )
  assert not reps.loc[2, 'identical'] and reps.loc[2, 'mean'] == pytest.approx((78.4 + 70.0) / 2)
  units = out.units.set_index(['arm', 'seed'])['value']
  assert units[('compute_dtype=bfloat16', 2)] == pytest.approx(74.2)  # replicates averaged
  excluded = dict(zip(out.excluded['run'], out.excluded['reason'], strict=True))
  assert excluded == {
    f'{tmp_path}/f32/s8': 'running: step 3/10',
    f'{tmp_path}/f32/s9': 'failed: loss is NaN',
  }
  arms = out.arms.set_index('arm')
  assert arms['deterministic'].tolist() == [False, True]
  assert 'different value' in arms['determinism'].iloc[0]
  assert arms['within_sd'].tolist() == pytest.approx([8.4 / np.sqrt(2), 0.0])
  pair = out.pairs.iloc[0]
  assert pair['paired'] and pair['n_pairs'] == 4  # bf16 is nondeterministic: paired all the same
  assert pair['design'] == (
    'paired: 4 shared seeds, same init and data order; '
    '1 unshared seed(s) left out of the paired tests'
  )


def test_report_opens_with_the_answer_then_setup_and_why(tmp_path, capsys):
  make_runs(tmp_path / 'runs')
  analyse.main([f'--runs={tmp_path}/runs', '--margin=1', '--margin-reason=a planted reason'])
  text = capsys.readouterr().out
  answer = text.split('## Answer')[1].split('## Setup')[0]
  assert '**Question.** Which numerical setting changes test accuracy on gpu' in answer
  assert '| compute_dtype=bfloat16 − compute_dtype=float32 | -2.90 |' in answer  # A − B, pp
  setup = text.split('## Setup')[1].split('## Why each verdict')[0]
  # data.task: a field the record predates counts as its default (runrecord/record.py row)
  assert (
    '- dataset: digits, task identity; train 1437 / test 360 images; one test image = 0.278 pp'
    in setup
  )
  assert '- training: 2 epochs, model resnet18 width 0.25, resolution 8 px' in setup
  assert 'compute_dtype=bfloat16 (4 seeds, 5 runs)' in setup
  assert 'equivalence margin: ±1 pp (from --margin: a planted reason)' in setup
  verdict = text.split('## Why each verdict')[1].split('## Arms')[0]
  assert (
    verdict.count('- **') == 1 and '**compute_dtype=bfloat16 vs compute_dtype=float32: ' in verdict
  )
  assert 'Power (estimated from n = 4 pairs; sd of the per-seed differences' in verdict
  assert (
    text.index('## Answer') < text.index('## Setup') < text.index('## Why') < text.index('## Arms')
  )


def test_cli_formats_and_small_arm(tmp_path, capsys):
  make_runs(tmp_path / 'runs')
  record.write_results(f'{tmp_path}/runs/tpu/s0', fake_results(0, 0.8, platform='tpu'))
  analyse.main([f'--runs={tmp_path}/runs', '--margin=1'])
  captured = capsys.readouterr()
  assert "arm 'tpu, compute_dtype=float32' has n < 2" in captured.err
  assert '| gpu, compute_dtype=bfloat16 | gpu, compute_dtype=float32 |' in captured.out
  assert 'tpu' not in captured.out.split('## Comparisons: every test')[1].split('## Design')[0]
  assert 'failed: loss is NaN' in captured.out
  analyse.main([f'--runs={tmp_path}/runs', '--format=latex'])
  tex = capsys.readouterr().out
  assert tex.startswith('\\begin{table}') and '\\toprule' in tex and 'bfloat16' in tex
  assert '**' not in tex and '\\item' not in tex and tex.count('\\begin{tabular}') == 3
  analyse.main([f'--runs={tmp_path}/runs', '--format=csv'])
  tables = csv_tables(capsys.readouterr().out)
  assert list(tables['arms']['n']) == [4, 5, 1] and len(tables['pairs']) == 1
  assert len(tables['excluded']) == 2 and len(tables['replicates']) == 2


def test_one_line_errors(tmp_path, capsys):
  with pytest.raises(ValueError, match='--runs: no run'):
    results.load_runs(str(tmp_path))
  with pytest.raises(ValueError, match='--runs: .* does not exist'):
    results.load_runs(str(tmp_path / 'nope'))
  with pytest.raises(ValueError, match="--metric: no column 'final.top5'"):
    stats.arms_and_pairs(frame({'a': [0.1, 0.2]}), metric='final.top5')
  with pytest.raises(ValueError, match="--seed-col: no column 'rep'"):
    stats.arms_and_pairs(frame({'a': [0.1, 0.2]}), seed_col='rep')
  with pytest.raises(ValueError, match='--margin'):
    stats.arms_and_pairs(frame({'a': [0.1, 0.2]}), margin=0)
  with pytest.raises(SystemExit) as e:
    analyse.main([f'--runs={tmp_path}'])
  message = capsys.readouterr().err
  assert (
    e.value.code == 2 and message.startswith('error: --runs: no run') and message.count('\n') == 1
  )
  failed = frame({'a': [0.1, 0.2]}).assign(status='failed')
  with pytest.raises(ValueError, match='none of the 2 runs is completed'):
    stats.arms_and_pairs(failed)


def test_root_of_only_failed_runs_lists_them_with_reasons(tmp_path, capsys):
  for seed, status, step in ((0, 'failed', 10), (1, 'running', 3)):
    results_ = fake_results(seed, 0.1, status=status, step=step)
    del results_['final']  # stopped before any evaluation: no metric column at all
    record.write_results(f'{tmp_path}/a/s{seed}', results_, step=step)
  with pytest.raises(SystemExit) as e:
    analyse.main([f'--runs={tmp_path}'])
  message = capsys.readouterr().err.rstrip('\n')
  assert (
    e.value.code == 2
    and message.startswith('error: --runs/--csv: none of the 2 runs is completed')
    and '\n' not in message
  )
  assert f'{tmp_path}/a/s0 (failed: loss is NaN)' in message
  assert f'{tmp_path}/a/s1 (running: step 3/10)' in message and '--metric' not in message


def test_non_finite_metric_in_csv_is_excluded_and_listed(tmp_path):
  values = [0.70, 0.71, float('inf'), 0.72, 0.69, 0.70, float('-inf'), 0.71]
  table = pd.DataFrame({'platform': ['tpu'] * 4 + ['gpu'] * 4, 'accuracy': values})
  table.to_csv(tmp_path / 'r.csv', index=False)
  assert 'inf' in (tmp_path / 'r.csv').read_text()
  out = stats.arms_and_pairs(
    csv_input.read_csv(str(tmp_path / 'r.csv')), group_by=['platform'], metric='accuracy'
  )
  excluded = dict(zip(out.excluded['run'], out.excluded['reason'], strict=True))
  assert excluded == {
    f'{tmp_path}/r.csv:4': 'accuracy = inf is not finite',
    f'{tmp_path}/r.csv:8': 'accuracy = -inf is not finite',
  }
  arms = out.arms.set_index('arm')
  assert list(arms['n']) == [3, 3] and np.isfinite(arms['mean']).all()
  assert arms.loc['tpu', 'mean'] == pytest.approx(100 * np.mean([0.70, 0.71, 0.72]))
  assert out.scale == 100  # the excluded inf does not turn the percent scaling off


def test_signed_rank_equals_scipys_exact_test_with_ties_and_zeros():
  rng = np.random.default_rng(5)
  for n in (6, 9, 12):
    d = rng.integers(-3, 4, size=n) * 0.278  # accuracy on 360 images: ties and zeros
    w, p, method = inference.signed_rank(d)
    nonzero = d[d != 0]
    ref = sps.wilcoxon(nonzero, method=sps.PermutationMethod(n_resamples=np.inf))
    assert (w, p) == pytest.approx((ref.statistic, ref.pvalue)) and method.startswith('exact')
  assert inference.signed_rank(np.zeros(5))[1] == 1.0


def test_paired_pairs_get_signed_rank_and_d_z_unpaired_ones_mann_whitney_and_g():
  rng = np.random.default_rng(6)
  a = 0.9 + rng.normal(0, 0.01, 8)
  b = a - 0.004 + rng.normal(0, 0.002, 8)
  pair = stats.arms_and_pairs(frame({'x': a, 'y': b}), margin=0.5).pairs.iloc[0]
  d = 100 * (a - b)
  assert pair['paired'] and pair['d_z'] == pytest.approx(d.mean() / d.std(ddof=1))
  assert pair['signed_rank_p'] == pytest.approx(sps.wilcoxon(d).pvalue)  # exact, no ties here
  # the unpaired effect size of the same data is far smaller: the seed spread stays in it
  assert abs(inference.hedges_g(100 * a, 100 * b)) < abs(pair['d_z']) / 3


def test_power_is_a_number_where_statsmodels_returns_nan():
  from statsmodels.stats import power as smp

  assert np.isnan(smp.TTestPower().power(2 / 0.76, 16, 0.05))  # the case the report showed as "–"
  power, _ = inference.power_at(0.76, 2.0, 16, is_paired=True)
  assert power == pytest.approx(1.0, abs=1e-9)
  assert inference.nct_power(0.5, 16, True) == pytest.approx(smp.TTestPower().power(0.5, 16, 0.05))


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
  judged = stats.judge(rows)
  assert (judged['test_p_holm'] < 0.05).all() and not judged['different'].any()
  off = [dict(r, lattice=None) for r in rows]  # the same numbers off a lattice: 'different'
  assert stats.judge(off)['different'].all()


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
  np.testing.assert_allclose(tested['tost_p_holm'], inference.holm(tested['tost_p']))
  # equal values without equal recorded arithmetic are tested like any pair
  plain = stats.arms_and_pairs(
    frame({'native': a, 'f32': a}, {'native': 'cpu', 'f32': 'cpu'}), margin=0.5
  )
  assert plain.pairs.iloc[0]['verdict'] == 'equivalent'
