"""analysis.stats on the published numbers: the published summary, and the published CSV
(two columns, or with seeds: duplicates averaged, seeds paired) through analysis.analyse."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import analyse
from tests.support.planted_stats import PUB_SEEDS, csv_tables, published_values, write_published


def test_published_values_match_the_published_summary():
  tpu, gpu = published_values()
  assert (round(tpu.mean(), 4), round(tpu.std(ddof=1), 4)) == (0.6979, 0.0090)
  assert (round(gpu.mean(), 4), round(gpu.std(ddof=1), 4)) == (0.6937, 0.0065)
  assert round(sps.ttest_ind(tpu, gpu, equal_var=False).pvalue, 4) == 0.1734
  assert tpu[0] == tpu[1] and tpu[5] == tpu[6] and gpu[0] != gpu[1] and gpu[5] != gpu[6]


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
