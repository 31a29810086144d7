"""analysis/agreement.py (the churn ladder, its pairs and its section) and
analysis/figures.py on planted predictions (no training, no saved runs)."""

import dataclasses
import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from analysis import agreement, analyse, declaration, figures, inputs, stats
from tests.conftest import ROOT
from tests.support.planted_predictions import N, planted_loader, prediction

CSV = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')


def entry(arm, seed, pred, platform='cpu', run=None):
  return {
    'run': run or f'/r/{platform}/{arm}/{seed}',
    'arm': arm,
    'seed': seed,
    'platform': platform,
    'pred': pred,
  }


def two_arms(churn_by_seed, seed=1):
  """Entries of arms 'a' and 'b' whose seed s differs in a share churn_by_seed[s] of images."""
  rng = np.random.default_rng(seed)
  entries = []
  for s, c in enumerate(churn_by_seed):
    pa = prediction(0.05, rng)
    entries += [entry('a', s, pa), entry('b', s, prediction(c, rng, base=pa['predicted']))]
  return entries


def test_churn_is_exactly_zero_for_identical_predictions_and_counts_bits_for_attributes():
  pred = prediction(0.1, np.random.default_rng(2))
  assert agreement.churn(pred['predicted'], pred['predicted'].copy()) == 0.0
  a = np.zeros((4, 40), bool)
  b = a.copy()
  b[0, :3] = True  # one image differs in 3 of its 40 bits
  assert agreement.churn(a, b) == 3 / 160  # over all n×40 bits, not 1/4 of the images
  table = agreement.agreement_table(
    [entry('a', 0, pred), entry('b', 0, dict(pred))], identical=[('a', 'b')]
  )
  row = table[table['kind'] == 'identical'].iloc[0]
  assert row['churn_pct'] == 0 and row['check'] == 'exactly 0, as constructed'


def test_identical_arithmetic_that_differs_is_flagged():
  table = agreement.agreement_table(two_arms([0.01, 0.02]), identical=[('a', 'b')])
  assert table.loc[table['kind'] == 'identical', 'check'].iloc[0].startswith('NOT 0')


def test_same_seed_churn_per_seed_then_t_interval_over_seeds():
  entries = two_arms([0.02, 0.04, 0.06, 0.03])
  by_seed = [
    agreement.churn(entries[i]['pred']['predicted'], entries[i + 1]['pred']['predicted'])
    for i in range(0, 8, 2)
  ]
  row = agreement.agreement_table(entries, pairs=[('a', 'b')]).set_index('kind').loc['contrast']
  x = np.array(by_seed)
  # the t-Wilson interval by hand: the mu with (mean - mu)^2 <= k mu (1 - mu)
  mean, k = x.mean(), sps.t.ppf(0.975, 3) ** 2 * x.var(ddof=1) / (4 * x.mean() * (1 - x.mean()))
  roots = np.roots([1 + k, -(2 * mean + k), mean**2])
  assert row['pairing'] == 'same seed' and row['seeds'] == 4
  assert row['churn_pct'] == pytest.approx(100 * mean)
  assert (row['ci_low'], row['ci_high']) == pytest.approx(sorted(100 * roots))
  assert 0 < row['ci_low'] < 100 * mean < row['ci_high'] < 100


def test_churn_interval_agrees_with_a_bootstrap_over_seeds():
  rates = np.random.default_rng(3).uniform(0.02, 0.08, 40)
  entries = two_arms(rates, seed=4)
  row = agreement.agreement_table(entries, pairs=[('a', 'b')]).set_index('kind').loc['contrast']
  x = np.array([float(v) for v in row['per_seed_pct'].split(', ')])
  boot = sps.bootstrap(
    (x,), np.mean, method='percentile', n_resamples=20000, rng=np.random.default_rng(0)
  ).confidence_interval
  width = row['ci_high'] - row['ci_low']
  assert abs(row['ci_low'] - boot.low) < 0.1 * width
  assert abs(row['ci_high'] - boot.high) < 0.1 * width


def test_seed_level_interval_is_wider_than_the_pooled_wilson_interval():
  """Seeds that differ a lot: pooling their images as one binomial sample (the nearest wrong
  version, the divergence tool's old interval) is far too narrow."""
  entries = two_arms([0.01, 0.10, 0.02, 0.12, 0.05])
  row = agreement.agreement_table(entries, pairs=[('a', 'b')]).set_index('kind').loc['contrast']
  count = sum(
    int(np.sum(entries[i]['pred']['predicted'] != entries[i + 1]['pred']['predicted']))
    for i in range(0, 10, 2)
  )
  low, high = (100 * v for v in proportion_confint(count, 5 * N, method='wilson'))
  assert row['churn_pct'] == pytest.approx(100 * count / (5 * N))
  assert (row['ci_high'] - row['ci_low']) > 3 * (high - low)
  assert row['ci_low'] < low and row['ci_high'] > high


def test_seed_churn_uses_disjoint_seed_pairs_and_replicates_give_nondeterminism_churn():
  rng = np.random.default_rng(5)
  preds = [prediction(0.2, rng) for _ in range(5)]
  entries = [entry('a', s, p) for s, p in enumerate(preds)]
  entries.append(entry('a', 0, prediction(0.01, rng, base=preds[0]['predicted']), run='/r/rep'))
  table = agreement.agreement_table(entries).set_index('kind')
  seed_row = table.loc['seed']
  assert seed_row['pairing'] == 'different seeds' and seed_row['seed_list'] == '0-1, 2-3'
  want = [
    np.mean(
      [
        agreement.churn(x['pred']['predicted'], preds[t]['predicted'])
        for x in entries
        if x['seed'] == s
      ]
    )
    for s, t in ((0, 1), (2, 3))
  ]
  assert seed_row['churn_pct'] == pytest.approx(100 * np.mean(want))
  nondet = table.loc['nondeterminism']
  assert nondet['seeds'] == 1 and nondet['seed_list'] == '0'
  assert nondet['churn_pct'] == pytest.approx(
    100 * agreement.churn(preds[0]['predicted'], entries[-1]['pred']['predicted'])
  )


def test_different_test_data_is_refused_naming_both_runs():
  rng = np.random.default_rng(6)
  entries = [
    entry('a', 0, prediction(0.1, rng)),
    entry('b', 0, prediction(0.1, rng, fingerprint='other')),
  ]
  with pytest.raises(ValueError, match='/r/cpu/a/0 and /r/cpu/b/0 predict different test data'):
    agreement.pair_churn(*entries)  # the table leaves such pairs out (test_split_seed_arms.py)


@pytest.fixture(scope='module')
def published():
  """analyse.study_analysis of the published H100 + CPU digits study with its declaration (read
  only)."""
  return analyse.study_analysis(
    inputs.read_csv(CSV), declaration.load(CSV.replace('.csv', '.study.json'))
  )


def test_baseline_pairs_from_the_recorded_arithmetic(published):
  out = published
  runs, by = out.runs, out.group_by

  def arm(platform, profile, bn='0', dtype='float32'):
    return runs.loc[
      (runs['platform'] == platform)
      & (runs['numerics.requested.profile'] == profile)
      & (runs['numerics.requested.batchnorm_group'].astype(str) == bn)
      & (runs['numerics.requested.compute_dtype'] == dtype),
      'arm',
    ].iloc[0]

  platform = agreement.platform_pairs(runs, by)
  assert (arm('cpu', 'native'), arm('gpu', 'native')) in platform
  assert (arm('cpu', 'tpu_default'), arm('gpu', 'tpu_default')) in platform and len(platform) == 8
  # CPU repeats bit for bit; the H100 runs were nondeterministic: no identical pair there.
  assert agreement.identical_pairs(runs, by) == [(arm('cpu', 'f32'), arm('cpu', 'native'))]
  assert sorted(agreement.noise_pairs(runs, by)) == [
    (arm('cpu', 'bf16_noise'), arm('cpu', 'f32')),
    (arm('gpu', 'bf16_noise'), arm('gpu', 'f32')),
  ]


def write_agreement(out, section, folder):
  """The agreement files of `out` with `section` (analyse.tables) and its churn ladder."""
  out = dataclasses.replace(out, agreement=section)
  names = ('report_agreement.csv', 'report_calibration.csv', 'report_train_loss.csv')
  names += ('report_per_class.csv', 'report_variance.csv')
  tables = {name: analyse.tables(out)[name] for name in names}
  paths = analyse.write_csv(tables, folder, analyse.SKIP_EMPTY)
  if not section.table.empty:
    ladder = figures.draw_churn_ladder(section.table, figures.context_line(out, 150))
    paths += figures.save(ladder, folder, 'churn_ladder', crop=False)
  return paths


def test_section_writes_the_csvs_and_the_ladder(tmp_path, published):
  out = published
  loaded = planted_loader(out.runs, np.random.default_rng(7))
  section = agreement.from_analysis(out, stats.arm_short_labels(out), load=loaded.get)
  table = section.table
  assert set(table['kind']) == {'identical', 'noise', 'contrast', 'platform', 'seed', 'seed_all'}
  # the declared contrasts but cpu's f32 − native, which is its identical-arithmetic row only
  assert len(table[table['kind'] == 'contrast']) == 13
  assert table.loc[table['kind'] == 'identical', 'label_a'].tolist() == ['cpu: f32']
  assert section.summary.startswith('Agreement (churn') and section.missing == []
  paths = write_agreement(out, section, str(tmp_path))
  names = {os.path.basename(p) for p in paths}
  assert {
    'report_agreement.csv',
    'report_calibration.csv',
    'report_train_loss.csv',
    'report_per_class.csv',
    'churn_ladder.png',
    'churn_ladder.pdf',
  } <= names
  written = pd.read_csv(tmp_path / 'report_agreement.csv')
  assert {'a', 'b', 'pairing', 'churn_pct', 'ci_low', 'ci_high', 'seeds'} <= set(written)
  assert set(written['pairing']) == {'same seed', 'different seeds'}


def test_old_records_without_predictions_still_analyse(tmp_path, published):
  out = published
  section = agreement.from_analysis(out, stats.arm_short_labels(out), load=lambda run: None)
  assert section.summary.startswith('Agreement: no predictions in any of the 256 runs')
  assert section.table.empty and section.calibration.empty
  assert len(section.train_loss) == 16  # from the runs table: still there
  paths = write_agreement(out, section, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == ['report_agreement.csv', 'report_train_loss.csv']


def test_some_runs_without_predictions_are_counted():
  entries = two_arms([0.02, 0.04])
  line = agreement.summary(agreement.agreement_table(entries, pairs=[('a', 'b')]), 3, 7)
  assert '3 of 7 runs without predictions left out' in line and 'numerics setting' in line


def test_without_a_declaration_every_pair_of_arms_on_one_platform_is_compared():
  out = analyse.study_analysis(inputs.read_csv(CSV), all_pairs=False)
  pairs = agreement.compared_pairs(out)
  assert len(pairs) == 2 * (8 * 7 // 2)
  assert all(a.split(',')[0] == b.split(',')[0] for a, b in pairs)


def test_a_long_ladder_is_cut_to_a_readable_page():
  rows = (
    [{'kind': 'contrast', 'platform_a': 'cpu'}] * 60
    + [{'kind': 'seed', 'platform_a': 'cpu'}] * 10
    + [{'kind': 'seed', 'platform_a': 'gpu'}] * 3
    + [{'kind': 'seed_all', 'platform_a': 'cpu'}]
  )
  drawn, left_out = figures.drawn_rows(pd.DataFrame(rows))
  assert len(drawn) == figures.MAX_ROWS and left_out == 60 - (figures.MAX_ROWS - 4)
  assert list(drawn['kind'].iloc[-4:]) == ['seed'] * 3 + ['seed_all']  # cpu's arms: pooled only


def test_seed_rows_of_every_arm_of_a_platform_pooled_by_clusters_of_shared_seeds():
  """Arms a and b are bit-identical (identical arithmetic), c is not: pooled as independent pairs
  (the nearest wrong version) two thirds of the sample repeat one model pair; clustered by seed
  pair the sample is the 3 seed pairs, each the mean over the arms, with the interval over them."""
  rng = np.random.default_rng(8)
  base = [prediction(0.2, rng) for _ in range(6)]
  entries = [
    entry(arm, s, base[s] if arm in 'ab' else prediction(0.05, rng, base[s]['predicted']))
    for arm in 'abc'
    for s in range(6)
  ]
  table = agreement.agreement_table(entries).set_index('kind')
  pred = {(e['arm'], e['seed']): e['pred']['predicted'] for e in entries}
  per_pair = {
    (s, s + 1): [100 * agreement.churn(pred[(arm, s)], pred[(arm, s + 1)]) for arm in 'abc']
    for s in (0, 2, 4)
  }
  assert per_pair[(0, 1)][0] == per_pair[(0, 1)][1]  # a and b: the same two models
  clustered = np.array([np.mean(v) for v in per_pair.values()])
  pooled = table.loc['seed_all']
  assert pooled['seeds'] == 3 and pooled['churn_pct'] == pytest.approx(clustered.mean())
  low, high = (100 * v for v in stats.proportion_mean_ci(clustered / 100))
  assert (pooled['ci_low'], pooled['ci_high']) == pytest.approx((low, high))
  assert '9 pairs of 3 arms in 3 clusters' in pooled['seed_list']
  naive = np.concatenate(list(per_pair.values()))  # 9 "independent" pairs: narrower, wrongly
  naive_low, naive_high = (100 * v for v in stats.proportion_mean_ci(naive / 100))
  assert naive_high - naive_low < high - low


def test_clusters_join_seed_pairs_that_share_a_seed():
  assert sorted(
    map(sorted, agreement.clusters([(0, 1), (2, 3), (1, 2), (4, 5), (6, 7), (7, 8)]))
  ) == [[0, 1, 2], [3], [4, 5]]


def crossed_runs(rng):
  """Arm 'a' crossing 4 init seeds × 4 data seeds × 2 replicates: each init seed its own model
  (30 % of images moved), each data seed moving 4 % more, each replicate 1 %."""
  rows, loaded = [], {}
  for i in range(4):
    by_init = prediction(0.3, rng)
    for j in range(4):
      by_data = prediction(0.04, rng, base=by_init['predicted'])
      for r in range(2):
        run = f'/r/a/init{i}/data{j}/rep{r}'
        loaded[run] = prediction(0.01, rng, base=by_data['predicted'])
        rows.append(
          {
            'run': run,
            'arm': 'a',
            'seed': 0,
            'platform': 'cpu',
            'init_seed': i,
            'data_seed': j,
            'replicate': r,
            'value': rng.normal(90, 1),
          }
        )
  return pd.DataFrame(rows), loaded


def test_churn_by_source_with_init_and_data_order_seeds():
  runs, loaded = crossed_runs(np.random.default_rng(9))
  section = agreement.agreement_section(runs, [], load=loaded.get)
  table = section.table.set_index('kind')
  assert table.loc['nondeterminism', 'seeds'] == 16  # every (init, data) cell repeated
  assert (
    table.loc['nondeterminism', 'churn_pct']
    < table.loc['data order', 'churn_pct']
    < table.loc['init', 'churn_pct']
  )

  def first(i, j):
    return [loaded[f'/r/a/init{i}/data{j}/rep{r}']['predicted'] for r in (0, 1)]

  def cross(x, y):
    return np.mean([agreement.churn(p, q) for p in x for q in y])

  per_init = [
    np.mean([cross(first(i, 0), first(i, 1)), cross(first(i, 2), first(i, 3))]) for i in range(4)
  ]  # disjoint data-seed pairs (0, 1), (2, 3) within each init seed
  assert table.loc['data order', 'churn_pct'] == pytest.approx(100 * np.mean(per_init))
  assert table.loc['data order', 'seed_list'] == 'init seeds 0, 1, 2, 3'
  variance_rows = section.variance.set_index('component')
  assert set(variance_rows.index) >= {'init', 'data order', 'nondeterminism (replicates)'}


def test_the_study_command_writes_the_agreement_files_from_a_csv(tmp_path, capsys):
  """A CSV holds no predictions: the agreement CSV comes with no rows, the loss table is there."""

  frame = pd.read_csv(CSV)
  keep = (
    frame['platform'].eq('cpu')
    & frame['seed'].lt(4)
    & frame['numerics.requested.profile'].isin(['f32', 'bf16_noise'])
  )
  frame[keep].to_csv(tmp_path / 'small.csv', index=False)
  analyse.main(['--csv', str(tmp_path / 'small.csv'), '--out', str(tmp_path / 'out')])
  written = capsys.readouterr().err
  assert 'report_agreement.csv' in written and 'report_train_loss.csv' in written
  assert pd.read_csv(tmp_path / 'out' / 'report_agreement.csv').empty
  assert len(pd.read_csv(tmp_path / 'out' / 'report_train_loss.csv')) == 2


def test_summary_line_names_each_rung_once_and_the_identical_check():
  rng = np.random.default_rng(10)
  preds = [prediction(0.2, rng) for _ in range(3)]
  entries = [entry(arm, s, dict(p)) for arm in 'ab' for s, p in enumerate(preds)]
  line = agreement.summary(agreement.agreement_table(entries, identical=[('a', 'b')]))
  assert 'identical arithmetic exactly 0 (checked)' in line
  assert line.count('seed: init and data order') == 1  # the pooled seed rung only, not each arm's
  line = agreement.summary(
    agreement.agreement_table(two_arms([0.02, 0.04]), identical=[('a', 'b')])
  )
  assert 'NOT 0 in 1 of 1 pairs' in line
