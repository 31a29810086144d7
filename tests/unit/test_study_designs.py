"""The same model without mixing models, on planted tables checked by hand: one replicate rule
(runrecord.rules.model_keys) where `seed` alone would merge different models; a variance-design
root (init × data-order seeds) whose churn rows split init / data order / both and whose variance
split reaches report.md and report.tex with its intervals; churn intervals near 0 and 100 %; a
constant per-class difference."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import agreement, analyse, report, stats
from experiments import lockstep
from runrecord import rules
from tests.support.planted_predictions import LABELS, prediction

METRIC = 'final.test_accuracy'
EFFECTIVE = {
  f'numerics.effective.{f}': v
  for f, v in (
    ('platform', 'cpu'),
    ('device_kind', 'cpu'),
    ('batchnorm_group', 0),
    ('compute_dtype', 'float32'),
    ('conv_format', 'f32'),
    ('dense_format', 'f32'),
    ('matmul_precision', 'highest'),
    ('param_dtype', 'float32'),
    ('xla_flags', ''),
  )
}
DECLARED = {
  'factors': ['platform', 'profile'],
  'reference': {'profile': 'native'},
  'margin': 2.0,
  'margin_reason': 'planted',
  'labels': {'profile': '{}'},
}


def run_row(profile, seed, init, data, acc):
  return {
    'run': f'/r/{profile}/s{seed}_i{init}_d{data}',
    'status': 'completed',
    'seed': seed,
    'init_seed': init,
    'data_seed': data,
    'platform': 'cpu',
    'device_kind': 'cpu',
    'numerics.requested.profile': profile,
    **EFFECTIVE,
    METRIC: acc,
  }


def merged_root():
  """native and f32 (identical arithmetic on a deterministic CPU) on seeds 0–3 (init = data =
  seed), and f32 once more as seed 1 with init seed 0: another model (81.4 % against 63.6 %)."""
  acc = {0: 0.70, 1: 0.636, 2: 0.75, 3: 0.68}
  rows = [run_row(p, s, s, s, acc[s]) for p in ('native', 'f32') for s in range(4)]
  rows.append(run_row('f32', 1, 0, 1, 0.814))
  return pd.DataFrame(rows)


def test_runs_of_one_seed_with_other_init_seeds_are_other_models_not_replicates():
  frame = merged_root()
  out = analyse.study_analysis(frame, DECLARED)
  assert out.replicates.empty  # no model was run twice
  f32 = out.units[out.units['arm'].str.contains('f32')].set_index('seed')['value']
  assert f32.loc['1 (init 0, data 1)'] == pytest.approx(81.4)  # its own unit, not averaged
  assert f32.loc['1 (init 1, data 1)'] == pytest.approx(63.6)
  (contrast,) = out.contrasts.itertuples()
  assert contrast.verdict == 'identical arithmetic' and contrast.n_pairs == 4
  assert contrast.diff == 0  # by seed alone: seed 1 = (63.6 + 81.4) / 2, Δ = +2.2 pp there
  assert 'unshared seed(s) left out' in contrast.design
  assert rules.model_keys([1, 1], [1, 0], [1, 1]) == ['1 (init 1, data 1)', '1 (init 0, data 1)']
  assert rules.model_keys([1, 2], [1, 2], [1, 2]) == [1, 2]  # init = data = seed: the seed


def test_agreement_pairs_models_by_the_same_rule():
  frame = merged_root()
  out = analyse.study_analysis(frame, DECLARED)
  rng = np.random.default_rng(1)
  model = {(i, d): prediction(0.2, rng) for i, d in ((0, 0), (1, 1), (2, 2), (3, 3), (0, 1))}
  loaded = {r.run: model[(r.init_seed, r.data_seed)] for r in frame.itertuples()}
  section = agreement.from_analysis(out, stats.arm_short_labels(out), load=loaded.get)
  row = section.table.set_index('kind').loc['identical']
  assert row['churn_pct'] == 0 and row['check'] == 'exactly 0, as constructed' and row['seeds'] == 4
  assert 'f32' in ' '.join(section.variance_notes)  # seeds vary, no full crossing: said, not silent


def crossed_root(rng):
  """The variance preset's design on a deterministic CPU: one arm, 4 init × 3 data-order seeds, one
  run each, seed = 3 init + data. Accuracy: init effect 0/2/4/6 pp, no data-order effect, a
  residual whose column means are 0 (so the data-order estimate is negative: truncated)."""
  residual = np.array([[0.3, -0.3, 0.0], [-0.3, 0.3, 0.0], [0.0, 0.2, -0.2], [0.0, -0.2, 0.2]])
  y = 80 + np.array([0, 2, 4, 6])[:, None] + residual
  frame = pd.DataFrame(
    [run_row('native', 3 * i + j, i, j, y[i, j] / 100) for i in range(4) for j in range(3)]
  )
  by_init = [prediction(0.3, rng) for _ in range(4)]
  loaded = {
    r.run: prediction(0.05, rng, by_init[r.init_seed]['predicted']) for r in frame.itertuples()
  }
  return frame, y, loaded


def test_a_variance_design_root_splits_churn_by_init_data_order_and_both():
  frame, _, loaded = crossed_root(np.random.default_rng(2))
  out = analyse.study_analysis(frame, DECLARED)
  section = agreement.from_analysis(out, stats.arm_short_labels(out), load=loaded.get)
  table = section.table.set_index('kind')
  pred = {(r.init_seed, r.data_seed): loaded[r.run]['predicted'] for r in frame.itertuples()}

  def churn(a, b):
    return 100 * agreement.churn(pred[a], pred[b])

  # different seeds: only models whose init and data seeds both differ, each model once
  both = [((0, 0), (1, 1)), ((0, 1), (1, 0)), ((0, 2), (2, 0)), ((1, 2), (2, 1)), ((2, 2), (3, 0))]

  def key(i, j):
    return f'{3 * i + j} (init {i}, data {j})'

  assert table.loc['seed', 'seed_list'] == ', '.join(f'{key(*a)}-{key(*b)}' for a, b in both)
  assert table.loc['seed', 'churn_pct'] == pytest.approx(np.mean([churn(a, b) for a, b in both]))
  data_only = [churn((i, 0), (i, 1)) for i in range(4)]  # per init seed: data seeds (0, 1)
  assert table.loc['data order', 'churn_pct'] == pytest.approx(np.mean(data_only))
  init_only = [np.mean([churn((0, j), (1, j)), churn((2, j), (3, j))]) for j in range(3)]
  assert table.loc['init', 'churn_pct'] == pytest.approx(np.mean(init_only))
  line = section.summary
  assert 'data order only' in line and 'initial weights only' in line
  assert 'seed: init and data order' in line


def hand_split(y):
  """Mean squares of a 4 × 3 table with one run per cell, by loops."""
  n_i, n_j = len(y), len(y[0])
  grand = sum(map(sum, y)) / (n_i * n_j)
  row = [sum(y[i]) / n_j for i in range(n_i)]
  col = [sum(y[i][j] for i in range(n_i)) / n_i for j in range(n_j)]
  ms_i = n_j * sum((r - grand) ** 2 for r in row) / (n_i - 1)
  ms_j = n_i * sum((c - grand) ** 2 for c in col) / (n_j - 1)
  ms_r = sum((y[i][j] - row[i] - col[j] + grand) ** 2 for i in range(n_i) for j in range(n_j)) / (
    (n_i - 1) * (n_j - 1)
  )
  return ms_i, ms_j, ms_r


def test_the_variance_split_reaches_report_md_and_tex_with_intervals_or_the_df_that_forbids_them():
  frame, y, loaded = crossed_root(np.random.default_rng(3))
  out = analyse.study_analysis(frame, DECLARED)
  out = dataclasses.replace(
    out, agreement=agreement.from_analysis(out, stats.arm_short_labels(out), load=loaded.get)
  )
  split = out.agreement.variance.set_index('component')
  ms_i, ms_j, ms_r = hand_split(y.tolist())
  init = (ms_i - ms_r) / 3
  nu = init**2 / ((ms_i / 3) ** 2 / 3 + (ms_r / 3) ** 2 / 6)  # Satterthwaite
  assert split.loc['init', 'estimate'] == pytest.approx(init)
  assert (split.loc['init', 'ci_low'], split.loc['init', 'ci_high']) == pytest.approx(
    (nu * init / sps.chi2.ppf(0.975, nu), nu * init / sps.chi2.ppf(0.025, nu))
  )
  residual = split.loc[stats.RESIDUAL]
  assert residual['estimate'] == pytest.approx(ms_r)
  assert (residual['ci_low'], residual['ci_high']) == pytest.approx(
    (6 * ms_r / sps.chi2.ppf(0.975, 6), 6 * ms_r / sps.chi2.ppf(0.025, 6))
  )  # exact χ²(6)
  assert split.loc['data order', 'estimate'] == pytest.approx((ms_j - ms_r) / 4)
  assert split.loc['data order', 'estimate'] < 0 and split.loc['data order', 'truncated']
  md = report.render(out, 'md')
  section = md.split('## Where the variance between runs comes from')[1].split('\n## ')[0]
  assert f'[{split.loc["init", "ci_low"]:.3f}, {split.loc["init", "ci_high"]:.3f}]' in section
  assert 'none: estimate truncated at 0' in section
  assert (
    'below 0, so set to 0: the data show no data order variance beyond what the other sources give'
  ) in section
  assert '4 init × 3 data-order seeds, no replicates (12 runs)' in section
  first = md.split('## Setup')[0]
  assert '**Variance between runs** of native (4 init × 3 data-order seeds' in first
  lo, hi = split.loc['init', 'ci_low'], split.loc['init', 'ci_high']
  assert f'(sd {split.loc["init", "sd"]:.2f} pp; variance 95% CI [{lo:.3f}, {hi:.3f}]' in first
  assert 'data order 0 % (sd 0.00 pp; no interval: estimate truncated at 0)' in first
  tex = report.render(out, 'latex')
  assert r'\label{tab:variance}' in tex and 'truncated at 0' in tex


def test_churn_intervals_stay_inside_0_and_100_percent():
  rng = np.random.default_rng(4)
  base = [prediction(0.1, rng) for _ in range(4)]
  near0 = [0.0, 0.0, 0.01, 0.0]  # one seed with 1 % of the images moved
  entries = []
  for s, c in enumerate(near0):
    other = prediction(c, rng, base[s]['predicted'])
    entries += [
      {'run': f'a{s}', 'arm': 'a', 'seed': s, 'platform': 'cpu', 'pred': base[s]},
      {'run': f'b{s}', 'arm': 'b', 'seed': s, 'platform': 'cpu', 'pred': other},
    ]
  row = agreement.agreement_table(entries, pairs=[('a', 'b')]).set_index('kind').loc['contrast']
  x = np.array([float(v) for v in row['per_seed_pct'].split(', ')])
  half = sps.t.ppf(0.975, 3) * x.std(ddof=1) / 2
  assert x.mean() - half < 0  # the t-interval: below 0 %
  assert 0 <= row['ci_low'] <= row['churn_pct'] <= row['ci_high'] <= 100
  flipped = np.array([0.995, 1.0, 1.0, 0.99])  # near 100 %: the t-interval passes 100
  low, high = (100 * v for v in stats.proportion_mean_ci(flipped))
  t_high = 100 * (flipped.mean() + sps.t.ppf(0.975, 3) * flipped.std(ddof=1) / 2)
  assert t_high > 100 and low <= 100 * flipped.mean() <= high <= 100


def test_a_constant_per_class_difference_reads_as_different_by_the_exact_test():
  """Class 3 is 2.5 pp better in arm a in each of 8 seeds: t = inf, p NaN read 'not different'; the
  exact signed-rank p of 8 differences of one sign is 2 / 2^8."""
  rng = np.random.default_rng(5)
  third = np.flatnonzero(LABELS == 3)
  entries = []
  for s in range(8):
    base = prediction(0.2, rng)
    better = base['predicted'].copy()
    wrong = third[base['predicted'][third] != 3]
    better[wrong[:2]] = 3  # the same number of class-3 images (2) fixed in every seed
    entries += [
      {'arm': 'a', 'seed': s, 'pred': {**base, 'predicted': better}},
      {'arm': 'b', 'seed': s, 'pred': base},
    ]
  table = agreement.class_differences(entries, 'a', 'b').set_index('class')
  want = 100 * 2 / len(third)
  assert table.loc[3, 'diff_pp'] == pytest.approx(want)
  assert table.loc[3, 'p'] == pytest.approx(2 / 2**8) and table.loc[3, 'test'] == agreement.EXACT
  assert table.loc[3, 'different']  # Holm over the one class tested: p stays 2 / 2^8
  assert np.isnan(table.loc[0, 'p']) and table.loc[0, 'test'] == agreement.NONE


def test_one_definition_of_disagreement_for_the_attributes_task():
  """40 attributes: churn counts the differing image × attribute labels, and so does the
  divergence tool now (it counted images with any attribute different: 5 × as much here); its
  per-pair interval is over the images (their labels are not independent)."""

  rng = np.random.default_rng(6)
  a = rng.random((200, 40)) < 0.5
  b = a.copy()
  flip = rng.random((200, 40)) < 0.02
  b[flip] = ~b[flip]
  pair = lockstep.pair_churn(a, b, [0, 0])
  bits = np.mean(a != b)
  assert pair['count'] / pair['n'] == pytest.approx(bits) == agreement.churn(a, b)
  assert np.mean((a != b).any(axis=1)) > 5 * bits  # the other definition
  shares = (a != b).mean(axis=1)
  assert (pair['ci_low'], pair['ci_high']) == pytest.approx(stats.proportion_mean_ci(shares))
  out = lockstep.disagreement([pair, lockstep.pair_churn(a, a, [1, 1])])
  assert out['pairs'][0]['rate'] == pytest.approx(bits) and out['pairs'][1]['rate'] == 0
  assert 0 <= out['across']['t_low'] <= out['across']['mean'] <= out['across']['t_high'] <= 1


def test_the_t_wilson_interval_covers_near_0_where_the_t_interval_does_not():
  """Churn per seed near 1 % (360 images, overdispersed between seeds as churn is), 6 seeds: the
  t-interval covers about 89 %, its reshaped t-Wilson version about 93 % (3000 studies)."""
  rng = np.random.default_rng(11)
  mu, m, phi, n, sims = 0.01, 6, 3, 360, 3000
  q = rng.beta(mu * n / phi, (1 - mu) * n / phi, (sims, m))
  p = rng.binomial(n, q) / n
  t_low, t_high = stats.t_ci(p)
  t_cover = np.mean((t_low <= mu) & (mu <= t_high))
  wilson = np.array([stats.proportion_mean_ci(row) for row in p])
  w_cover = np.mean((wilson[:, 0] <= mu) & (mu <= wilson[:, 1]))
  assert w_cover >= 0.915 and w_cover > t_cover + 0.02, (w_cover, t_cover)


def test_one_failed_run_is_excluded_counted_with_its_repair_and_the_levels_keep_their_type():
  """Issue 42, item 15: a failed run's empty numerics cells turned batchnorm_group into floats
  (0.0, 16.0) and the report stopped at '--reference: batchnorm_group has no level '0''. By hand:
  the study with the failed run equals the study without its row, and the first page counts it."""
  import os

  from analysis import declaration, inputs, report
  from tests.conftest import ROOT

  csv = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
  declared = declaration.load(csv.replace('.csv', '.study.json'))
  frame = inputs.read_csv(csv).astype(object)
  frame.loc[0, ['status', 'reason']] = ['failed', 'loss is NaN at step 40']
  for column in [c for c in frame if c.startswith(('final.', 'numerics.'))]:
    frame.loc[0, column] = None
  frame = frame.infer_objects()
  assert frame['numerics.requested.batchnorm_group'].dtype.kind == 'f'  # the column turned float
  out = analyse.study_analysis(frame, declared)
  alone = analyse.study_analysis(frame.iloc[1:].reset_index(drop=True), declared)
  assert out.attribution.reference['batchnorm_group'] == '0'
  pd.testing.assert_frame_equal(out.contrasts, alone.contrasts)
  assert out.attribution.decomposition[0].G == alone.attribution.decomposition[0].G
  assert list(out.excluded['status']) == ['failed'] and len(out.runs) == 255
  line = report.excluded_lines(out)[1]
  assert line.startswith('**Excluded:** 1 of 256 runs (1 failed: loss is NaN at step 40)')
  assert 'python -m sweeps.sweep' in line and 'make study' in line


def test_a_rank_test_bound_contrast_says_so_and_a_ci_wholly_past_the_margin_is_not_equivalent():
  """Issue 42, item 3: five paired seeds on the 1/360 lattice whose differences are 4, 5, 6, 4 and
  7 test images. By hand: mean 5.2 images = 1.4444 pp, sd √1.7 images, t = 5.2 / (√1.7 / √5) =
  8.918 on 4 df (p 0.00088), the 90% CI 1.4444 ± 2.1318 × 0.16197 = [1.099, 1.790] pp; the exact
  signed-rank p cannot go below 2 / 2^5 = 0.0625. At ±0.5 the 90% CI lies wholly past +0.5: not
  equivalent; at ±1.6 it straddles +1.6: inconclusive, because of the rank test."""
  from tests.unit.test_stats import lattice_frame

  d = np.array([4, 5, 6, 4, 7]) / 360 * 100
  se = d.std(ddof=1) / np.sqrt(5)
  assert d.mean() == pytest.approx(1.44444, abs=1e-5) and se == pytest.approx(0.161971, abs=1e-6)
  half = sps.t.ppf(0.95, 4) * se
  for margin, verdict, short in (
    (0.5, 'not equivalent', 'not equivalent: 90% CI wholly past +0.5'),
    (1.6, 'inconclusive', 'inconclusive: the rank test cannot reach α = 0.05 at 5 seeds'),
  ):
    out = stats.arms_and_pairs(lattice_frame([4, 5, 6, 4, 7], 5), margin=margin)
    pair = out.pairs.iloc[0]
    assert pair['diff'] == pytest.approx(d.mean()) and pair['paired_p'] == pytest.approx(
      2 * sps.t.sf(d.mean() / se, 4)
    )
    assert (pair['ci90_low'], pair['ci90_high']) == pytest.approx((1.0991, 1.7898), abs=1e-4)
    assert pair['ci90_low'] == pytest.approx(d.mean() - half)
    assert pair['signed_rank_p'] == pytest.approx(0.0625) and pair['verdict'] == verdict
    assert report.contrast_verdict(pair, margin) == short
    why = report.verdict_why(pair, margin, 'pp', 1)
    assert 'cannot reach α = 0.05 at 5 seeds (its smallest two-sided p is 0.0625)' in why
    assert ('lies wholly past +0.5 pp' in why) == (margin == 0.5)


def test_zero_variance_has_one_exact_rule_in_contrasts_gap_and_noise_floor():
  """Issue 42, items 5 and 8: arm y repeats x bit for bit (not the same recorded arithmetic: it is
  tested), z sits 0.3 pp above x on every seed, w varies. By hand: x − y is 0 on every seed, so the
  exact t-test p is 1 and the TOST p at ±0.5 is 0 (|0| < 0.5); z − x is +0.3 on every seed (float
  noise in the sd): exact p 0, 95% CI [0.3, 0.3], no d_z; all three pairs with x stay in Holm's
  family of 6."""
  import types

  from analysis import attribution
  from tests.support.planted_stats import frame

  rng = np.random.default_rng(3)
  x = 0.9 + rng.integers(-9, 9, 6) / 1000
  arms = {'x': x, 'y': x.copy(), 'z': x + 0.003, 'w': x + rng.normal(0, 0.004, 6)}
  out = stats.arms_and_pairs(frame(arms, {k: 'gpu' for k in arms}), margin=0.5)
  pairs = out.pairs.set_index(['arm_a', 'arm_b'])
  same = pairs.loc[('compute_dtype=x', 'compute_dtype=y')]
  shift = pairs.loc[('compute_dtype=x', 'compute_dtype=z')]
  assert stats.family_size(out.pairs) == 6 and out.pairs['test_p_holm'].notna().all()
  assert (same['paired_p'], same['tost_p'], same['verdict']) == (1.0, 0.0, 'equivalent')
  assert (shift['paired_p'], shift['tost_p']) == (0.0, 0.0) and np.isnan(shift['d_z'])
  assert shift['ci95_low'] == shift['ci95_high'] == pytest.approx(-0.3)
  assert shift['verdict'] == 'within margin'  # shown exactly, and inside ±0.5
  assert report.contrast_verdict(same, 0.5) == 'equivalent (exact: no variance)'
  why = report.verdict_why(same, 0.5, 'pp', 6)
  assert 'no variance, so the tests are exact: t-test p = 1' in why and 'Holm over 6' in why
  assert stats.tost(0.5 - 1e-13, 0.0, 5, 0.5)[2] == 1.0  # at the margin: not within
  assert stats.tost(0.3, 0.0, 5, 0.5)[2] == 0.0
  gap_row = attribution.component_stats(100 * (x - arms['y']), 0.5)  # the gap's rule is the same
  assert (gap_row['p'], gap_row['tost_p'], gap_row['sd']) == (1.0, 0.0, 0.0)
  assert np.isnan(gap_row['d_z'])
  floor = stats.NoiseFloor(0.0, 0.0, 6, 'y − x')
  fake = types.SimpleNamespace(noise={'gpu': floor}, unit='pp', margin=0.5)
  table = pd.DataFrame([same]).assign(platform='gpu', label='y')
  assert report.contrast_rows(fake, table)[0]['noise floor'] == 'within'  # 0.00 within ±0.00


def test_bit_identical_replicates_give_a_component_exactly_0_not_truncated():
  y = [[[80.0, 80.0], [81.0, 81.0]], [[83.0, 83.0], [82.5, 82.5]]]  # replicates bit-identical
  frame = pd.DataFrame(
    [
      {'value': y[i][j][k], 'init_seed': i, 'data_seed': j}
      for i in range(2)
      for j in range(2)
      for k in range(2)
    ]
  )
  table = stats.variance_components(frame).assign(arm='native', runs=8)
  rows = {r['component']: r for r in report.variance_rows(table, 'pp')}
  zero = table[table['estimate'] == 0]
  assert len(zero) == 1 and not zero['truncated'].iloc[0]  # MS within = 0 exactly
  row = rows[zero['component'].iloc[0]]
  assert row['95% CI of the variance'] == 'none: estimate exactly 0 (no spread between these runs)'
  assert row['note'] == ''
