"""analysis.results and analysis.stats on planted numbers and fake Orbax runs (no training)."""

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats import multitest, power as smp, weightstats
from statsmodels.stats.meta_analysis import effectsize_smd

from analysis import results, stats
from trainer import record

METRIC = 'final.test_accuracy'


def frame(arms, platforms=None, deterministic=None):
  """A runs table: arms = {dtype: [accuracy fraction per seed 0..n-1]}."""
  rows = []
  for dtype, values in arms.items():
    platform = (platforms or {}).get(dtype, 'tpu')
    for seed, value in enumerate(values):
      row = {'run': f'/r/{dtype}/{seed:03d}', 'status': 'completed', 'reason': '', 'seed': seed,
             'platform': platform, 'numerics.requested.compute_dtype': dtype, METRIC: value}
      if deterministic is not None:
        row['numerics.requested.gpu_deterministic'] = deterministic.get(dtype, False)
      rows.append(row)
  return pd.DataFrame(rows)


def fake_results(seed, acc, platform='gpu', dtype='float32', status='completed', det=True, step=10):
  req = {'matmul_precision': 'highest', 'compute_dtype': dtype, 'param_dtype': 'float32',
         'emulate': 'none', 'batchnorm_group': 0, 'gpu_deterministic': det}
  hist = [{'epoch': e, 'step': 5 * e, 'test_accuracy': acc * e / 2, 'test_loss': 1.0 / e,
           'train_loss': 0.5 / e, 'lr': 0.01, 'wall_time': float(e)} for e in (1, 2)]
  return {'status': status, 'reason': 'loss is NaN' if status == 'failed' else '', 'seed': seed,
          'platform': platform, 'device_kind': 'NVIDIA H100', 'num_devices': 1, 'num_processes': 1,
          'numerics': {'requested': req, 'effective': req},
          'final': {'test_accuracy': acc, 'test_loss': 1.0, 'train_loss': 0.1}, 'history': hist,
          'config': {'seed': seed, 'numerics': req, 'model': {'width': 0.25, 'reinit': ['stem']}},
          'versions': {'jax': 'x'}, 'wall_time_s': 1.0, 'step': step, 'total_steps': 10,
          'data': {'name': 'digits'}}


def test_planted_shift_is_detected():
  rng = np.random.default_rng(0)
  a, b = 0.70 + rng.normal(0, 0.003, 10), 0.71 + rng.normal(0, 0.003, 10)  # 1 pp shift, sd .3 pp
  out = stats.analyse(frame({'bfloat16': a, 'float32': b}, {'bfloat16': 'gpu', 'float32': 'gpu'}),
                      margin=0.5)
  pair = out['pairs'].iloc[0]
  assert out['scale'] == 100 and pair['diff'] == pytest.approx(100 * (a.mean() - b.mean()))
  assert pair['welch_p_holm'] < 0.001 and pair['mw_p'] < 0.01
  assert not pair['equivalent'] and pair['tost_p'] > 0.5 and not pair['paired']
  assert pair['ci90_high'] < -0.5  # the whole interval is outside the margin


def test_identical_distributions_are_equivalent_and_not_different():
  rng = np.random.default_rng(1)
  a, b = 0.70 + rng.normal(0, 0.001, 20), 0.70 + rng.normal(0, 0.001, 20)  # sd .1 pp, no shift
  out = stats.analyse(frame({'x': a, 'y': b}, {'x': 'gpu', 'y': 'gpu'}), margin=0.2)
  pair = out['pairs'].iloc[0]
  assert pair['welch_p'] > 0.05 and pair['equivalent'] and pair['tost_p'] < 0.05
  assert -0.2 < pair['ci90_low'] < pair['ci90_high'] < 0.2
  same = stats.analyse(frame({'x': a, 'y': a[::-1]}, {'x': 'gpu', 'y': 'gpu'}), margin=0.2)
  assert same['pairs'].iloc[0]['welch_p'] == pytest.approx(1.0)
  assert same['pairs'].iloc[0]['equivalent']


def test_every_statistic_equals_scipy_and_statsmodels():
  rng = np.random.default_rng(2)
  a, b = 70 + rng.normal(0, 0.8, 7), 69.5 + rng.normal(0, 0.5, 6)
  t, df, p = stats.welch(a, b)
  sm_t, sm_p, sm_df = weightstats.ttest_ind(a, b, usevar='unequal')
  assert (t, p, df) == pytest.approx((sm_t, sm_p, sm_df))
  low, high, tp = stats.tost_ind(a, b, 0.6)
  assert tp == pytest.approx(weightstats.ttost_ind(a, b, -0.6, 0.6, usevar='unequal')[0])
  cm = weightstats.CompareMeans(weightstats.DescrStatsW(a), weightstats.DescrStatsW(b))
  assert (low, high) == pytest.approx(cm.tconfint_diff(alpha=0.1, usevar='unequal'))
  x, y = a[:6], b  # paired by position
  low, high, tp = stats.tost_paired(x - y, 0.6)
  assert tp == pytest.approx(weightstats.ttost_paired(x, y, -0.6, 0.6)[0])
  assert (low, high) == pytest.approx(weightstats.DescrStatsW(x - y).tconfint_mean(alpha=0.1))
  g = stats.hedges_g(a, b)
  assert g == pytest.approx(effectsize_smd(a.mean(), a.std(ddof=1), 7, b.mean(), b.std(ddof=1), 6)[0])
  ps = [0.01, np.nan, 0.04, 0.03, 0.2]
  expect = multitest.multipletests([0.01, 0.04, 0.03, 0.2], method='holm')[1]
  assert np.isnan(stats.holm(ps)[1])
  assert stats.holm(ps)[[0, 2, 3, 4]] == pytest.approx(expect)
  low, high = stats.bca_ci(a)
  ref = sps.bootstrap((a,), np.mean, method='BCa', n_resamples=stats.BOOTSTRAP_RESAMPLES,
                      rng=np.random.default_rng(stats.BOOTSTRAP_SEED)).confidence_interval
  assert (low, high) == pytest.approx((ref.low, ref.high)) and low < a.mean() < high


def test_pairwise_table_matches_direct_calls_and_exact_mann_whitney():
  a, b = np.array([.70, .71, .69, .72, .70]), np.array([.68, .69, .70, .67, .66, .69])
  out = stats.analyse(frame({'a': a, 'b': b}, {'a': 'gpu', 'b': 'gpu'}), margin=1.0)
  pair = out['pairs'].iloc[0]
  assert pair['welch_p'] == pytest.approx(sps.ttest_ind(100 * a, 100 * b, equal_var=False).pvalue)
  # Exact two-sided Mann–Whitney by enumerating every split of the pooled ranks.
  pooled, u_obs = np.concatenate([a, b]), sps.mannwhitneyu(a, b).statistic
  ranks = sps.rankdata(pooled)
  us = [ranks[list(idx)].sum() - 15 for idx in itertools.combinations(range(11), 5)]
  mean_u = 15
  p_exact = np.mean([abs(u - mean_u) >= abs(u_obs - mean_u) - 1e-9 for u in us])
  assert pair['mw_u'] == u_obs and pair['mw_p'] == pytest.approx(p_exact)
  arm = out['arms'].set_index('arm').loc['compute_dtype=a']
  assert (arm['n'], arm['mean'], arm['sd']) == pytest.approx((5, 100 * a.mean(), 100 * a.std(ddof=1)))


def test_three_runs_per_arm_cannot_reach_significance_with_exact_mann_whitney():
  out = stats.analyse(frame({'a': [.1, .2, .3], 'b': [.7, .8, .9]}, {'a': 'gpu', 'b': 'gpu'}))
  assert out['pairs'].iloc[0]['mw_p'] == pytest.approx(0.1)  # REFERENCE §4: min p = 0.10


def test_seeds_needed_matches_reference_table():
  # REFERENCE §4: 0.2 pp difference / equivalence, 80% power: 6 at sd .1, 17-18 at .2, 37-40 at .3.
  assert stats.seeds_needed(0.1, 0.2)[0] == 6
  assert stats.seeds_needed(0.2, 0.2) == (17, 18)
  assert 37 <= stats.seeds_needed(0.3, 0.2)[0] <= stats.seeds_needed(0.3, 0.2)[1] <= 40
  n = smp.TTestIndPower().solve_power(effect_size=2 / 3, alpha=0.05, power=0.8)
  assert stats.seeds_needed(0.3, 0.2)[0] == int(np.ceil(n))
  # Monte Carlo: with n_equiv seeds per arm and no true difference, TOST succeeds ~80% of the time.
  n_eq = stats.seeds_needed(0.2, 0.2)[1]
  rng = np.random.default_rng(3)
  x, y = rng.normal(0, 0.2, (4000, n_eq)), rng.normal(0, 0.2, (4000, n_eq))
  se = np.sqrt(x.var(1, ddof=1) / n_eq + y.var(1, ddof=1) / n_eq)
  hit = np.abs(x.mean(1) - y.mean(1)) + sps.t.ppf(0.95, 2 * n_eq - 2) * se < 0.2
  assert 0.77 < hit.mean() < 0.88


def test_paired_only_when_deterministic_and_aligned_by_seed():
  rng = np.random.default_rng(4)
  base = 0.7 + rng.normal(0, 0.01, 8)
  values = {'a': base, 'b': base + 0.001 + rng.normal(0, 0.0002, 8)}
  det = stats.analyse(frame(values, {'a': 'tpu', 'b': 'gpu'}, {'b': True}), margin=0.5)
  df = det['runs'].iloc[::-1]  # shuffled order must not matter: pairs are by seed
  det2 = stats.analyse(df.drop(columns=['arm', 'value', 'det', 'det_why']), margin=0.5)
  for out in (det, det2):
    pair = out['pairs'].iloc[0]
    assert pair['paired'] and pair['n_pairs'] == 8 and 'paired' in pair['design']
    assert pair['paired_p'] == pytest.approx(sps.ttest_rel(100 * values['a'], 100 * values['b']).pvalue)
    assert pair['paired_p'] < 0.001 < pair['welch_p']  # seed variance removed by pairing
    assert pair['equivalent']
  nondet = stats.analyse(frame(values, {'a': 'tpu', 'b': 'gpu'}, {'b': False}), margin=0.5)
  pair = nondet['pairs'].iloc[0]
  assert not pair['paired'] and np.isnan(pair['paired_p']) and 'not both deterministic' in pair['design']


def make_runs(root):
  """Two GPU arms (float32 deterministic, bfloat16 not) + a duplicate, a failed and a running run."""
  for seed in range(4):
    record.write_results(f'{root}/f32/s{seed}', fake_results(seed, 0.80 + 0.001 * seed))
    record.write_results(f'{root}/bf16/s{seed}', fake_results(seed, 0.78 + 0.002 * seed, dtype='bfloat16', det=False))
  record.write_results(f'{root}/f32/s1_again', fake_results(1, 0.801))  # same value: deterministic
  record.write_results(f'{root}/bf16/s2_again', fake_results(2, 0.70, dtype='bfloat16', det=False))
  record.write_results(f'{root}/f32/s9', fake_results(9, 0.1, status='failed'))
  record.write_results(f'{root}/f32/s8', fake_results(8, 0.1, status='running', step=3), step=3)
  record.write_results(f'{root}/f32/s7', fake_results(7, 0.1, status='running', step=3), step=3)
  record.write_results(f'{root}/f32/s7', fake_results(7, 0.803, step=10), step=10)  # finished later


def test_orbax_runs_duplicates_and_failed_runs(tmp_path):
  make_runs(tmp_path)
  runs, hist = results.load(str(tmp_path))
  assert len(runs) == 13 and list(runs['run']) == sorted(runs['run'])
  assert runs.set_index('run').loc[f'{tmp_path}/f32/s7', 'status'] == 'completed'  # latest step
  assert {'numerics.requested.compute_dtype', 'config.model.width', 'final.test_loss',
          'config.model.reinit'} <= set(runs.columns)
  assert set(hist.columns) >= {'run', 'epoch', 'test_accuracy'} and len(hist) == 26
  out = stats.analyse(runs, margin=0.5)
  assert list(out['arms']['n']) == [4, 5]
  dups = out['duplicates'].set_index('dropped')
  assert dups.loc[f'{tmp_path}/f32/s1_again', 'kept'] == f'{tmp_path}/f32/s1'
  assert bool(dups.loc[f'{tmp_path}/f32/s1_again', 'same'])
  assert not bool(dups.loc[f'{tmp_path}/bf16/s2_again', 'same'])
  bf16 = out['runs'][out['runs']['arm'].str.contains('bfloat16')]
  assert 0.70 * 100 not in list(bf16['value'])  # the first run of seed 2 is the one kept
  excluded = dict(zip(out['excluded']['run'], out['excluded']['reason']))
  assert excluded == {f'{tmp_path}/f32/s8': 'running: step 3/10', f'{tmp_path}/f32/s9': 'failed: loss is NaN'}
  arms = out['arms'].set_index('arm')
  assert arms['deterministic'].tolist() == [False, True]
  assert 'different value' in arms['determinism'].iloc[0]


def test_cli_formats_and_small_arm(tmp_path, capsys):
  make_runs(tmp_path / 'runs')
  record.write_results(f'{tmp_path}/runs/tpu/s0', fake_results(0, 0.8, platform='tpu'))
  stats.main([f'--runs={tmp_path}/runs', '--margin=1'])
  captured = capsys.readouterr()
  assert "arm 'tpu, compute_dtype=float32' has n < 2" in captured.err
  assert '| gpu, compute_dtype=bfloat16 | gpu, compute_dtype=float32 |' in captured.out
  assert 'tpu' not in captured.out.split('## Pairwise')[1].split('## Duplicate')[0]
  assert 'failed: loss is NaN' in captured.out
  stats.main([f'--runs={tmp_path}/runs', '--format=latex', f'--out={tmp_path}/t.tex'])
  tex = (tmp_path / 't.tex').read_text()
  assert tex.startswith('\\begin{table}') and '\\toprule' in tex and 'bfloat16' in tex
  stats.main([f'--runs={tmp_path}/runs', '--format=csv', f'--out={tmp_path}/t.csv'])
  arms = pd.read_csv(tmp_path / 't_arms.csv')
  assert list(arms['n']) == [4, 5, 1] and (tmp_path / 't_pairs.csv').exists()
  assert len(pd.read_csv(tmp_path / 't_excluded.csv')) == 2


def test_csv_mode_reanalyses_published_numbers(tmp_path, capsys):
  seeds = [42, 42, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10]  # the reference study's seed list
  rng = np.random.default_rng(5)
  tpu, gpu = 69.79 + rng.normal(0, 0.9, 14), 69.37 + rng.normal(0, 0.65, 14)
  tpu[1], tpu[6] = tpu[0], tpu[5]  # TPU repeats bit-for-bit
  pd.DataFrame({'platform': ['tpu'] * 14 + ['gpu'] * 14, 'seed': seeds * 2,
                'accuracy': np.concatenate([tpu, gpu])}).to_csv(tmp_path / 'pub.csv', index=False)
  stats.main(['--csv', str(tmp_path / 'pub.csv'), '--group-by', 'platform', '--metric', 'accuracy',
              '--format=csv', f'--out={tmp_path}/o.csv'])
  arms = pd.read_csv(tmp_path / 'o_arms.csv').set_index('arm')
  pairs = pd.read_csv(tmp_path / 'o_pairs.csv')
  assert arms.loc['tpu', 'n'] == 12 and arms.loc['gpu', 'n'] == 12
  assert not arms.loc['gpu', 'deterministic'] and arms.loc['tpu', 'deterministic']
  keep = [0, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13]
  assert pairs.loc[0, 'welch_p'] == pytest.approx(sps.ttest_ind(gpu[keep], tpu[keep], equal_var=False).pvalue)
  assert len(pd.read_csv(tmp_path / 'o_duplicates.csv')) == 4 and pairs.loc[0, 'n80_diff'] > 12


def test_one_line_errors(tmp_path, capsys):
  with pytest.raises(ValueError, match='--runs: no run'):
    results.load_runs(str(tmp_path))
  with pytest.raises(ValueError, match='--runs: .* does not exist'):
    results.load_runs(str(tmp_path / 'nope'))
  with pytest.raises(ValueError, match="--metric: no column 'final.top5'"):
    stats.analyse(frame({'a': [.1, .2]}), metric='final.top5')
  with pytest.raises(ValueError, match='--margin'):
    stats.analyse(frame({'a': [.1, .2]}), margin=0)
  with pytest.raises(SystemExit) as e:
    stats.main([f'--runs={tmp_path}'])
  assert str(e.value).startswith('error: --runs: no run') and '\n' not in str(e.value)
  failed = frame({'a': [.1, .2]}).assign(status='failed')
  with pytest.raises(ValueError, match='none of the 2 runs is completed'):
    stats.analyse(failed)
