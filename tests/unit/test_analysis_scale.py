"""analysis.stats and analysis.attribution at scale and on hostile input (issue #23,
items 1-3 and the analysis parts of 9): methods chosen by size, seed fixed effects without dense
seed matrices, the memory guard, arms split by every config field, integer seeds, one-line errors.
Moderate sizes only (seconds); the 10^5-row numbers are benchmarks/bench_analysis.py's."""

import itertools
import tracemalloc

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from pandas.core.groupby import groupby as pd_groupby
from scipy import stats as sps

from analysis import analyse, attribute, attribution, inputs, report, stats
from benchmarks import bench_analysis
from runrecord import rules
from tests.support.planted_runs import make_record, smoke


def one_line_error(capsys, main, argv):
  """(exit code, stderr) of a CLI main that must stop with one line."""
  with pytest.raises(SystemExit) as e:
    main(argv)
  err = capsys.readouterr().err
  assert err.count('\n') == 1, err
  return e.value.code, err


# Item 1: attribution that scales.


def test_seed_fixed_effects_equal_statsmodels_ols_with_seed_dummies():
  """The within (demeaning) fit: the coefficients of OLS with one dummy per seed, and its
  cluster-robust covariance = statsmodels' sandwich (dense dummies) times the CR1 factor
  G/(G-1) (N-1)/(N-K), K = the factor columns (the seed effects, nested in their clusters, not
  counted; Cameron & Miller 2015). Unbalanced: runs dropped at random, some seeds repeated."""
  rng = np.random.default_rng(5)
  runs = bench_analysis.runs_table(40, rng=5)
  runs = pd.concat([runs.sample(frac=0.8, random_state=1), runs.iloc[:12]], ignore_index=True)
  runs['value'] = 100 * runs['accuracy'] + rng.normal(0, 0.05, len(runs))
  X = attribution.design(runs, ['platform', 'profile'], {'platform': 'gpu', 'profile': 'native'})
  model = attribution.seed_fixed_effects(runs['value'], X, runs['seed'], note='test')
  dummies = pd.get_dummies(runs['seed'], prefix='seed', drop_first=True).astype(float)
  groups = pd.factorize(runs['seed'])[0]
  dense = sm.OLS(runs['value'], pd.concat([X, dummies], axis=1)).fit(
    cov_type='cluster', cov_kwds={'groups': groups, 'use_correction': False}, use_t=True
  )
  factors = [c for c in X if c != 'Intercept']
  n, g, k = len(runs), runs['seed'].nunique(), len(factors)
  res = model['result']
  assert res.params[factors].to_numpy() == pytest.approx(dense.params[factors].to_numpy(), rel=1e-9)
  cr1 = g / (g - 1) * (n - 1) / (n - k)
  assert res.cov_params().loc[factors, factors].to_numpy() == pytest.approx(
    cr1 * dense.cov_params().loc[factors, factors].to_numpy(), rel=1e-9
  )
  term, df = attribution.contrast(model, {'profile=tpu_default': 1.0})
  half = sps.t.ppf(0.975, g - 1) * term.se
  assert df == g - 1 and term.ci_high - term.estimate == pytest.approx(half)
  assert 'seed fixed effects (within' in model['method'] and 'CR1' in model['method']


def test_many_seeds_fit_seed_fixed_effects_in_bounded_memory_and_say_why():
  """Beyond attribution.MIXED_MAX_ROWS runs MixedLM is not fitted (its time grows with the seeds);
  seed fixed effects take its place, without any runs x seeds matrix (24,000 x 6,000 doubles
  would be 1.15 GB; the whole analysis stays under 60 MB here). Small tables still get MixedLM."""
  frame = bench_analysis.runs_table(6_000)
  assert len(frame) > attribution.MIXED_MAX_ROWS
  tracemalloc.start()
  try:
    out = attribution.factor_attribution(frame, ['platform', 'profile'], 'accuracy', margin=0.3)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 60e6, peak
  assert out.method.startswith('OLS with seed fixed effects (within')
  assert f'MixedLM not fitted: {len(frame):,} runs > {attribution.MIXED_MAX_ROWS:,}' in out.method
  # the gap is per seed (no model); its mixed-model cross-check falls back the same way
  assert 'MixedLM not fitted' in out.decomposition[0].cross_check.method
  t = out.terms.set_index('term').loc['profile=tpu_default']
  assert t['ci_low'] < 0.3 < t['ci_high']
  small = attribution.factor_attribution(
    bench_analysis.runs_table(30), ['platform', 'profile'], 'accuracy'
  )
  assert small.method.startswith('MixedLM (REML)')


def test_memory_guard_refuses_a_design_it_cannot_hold(tmp_path, capsys):
  """A 'factor' with one level per run (10,000 runs): the design alone would be 10,000 x 10,001
  doubles, several copies of it; refused before any fit, one line naming --factors and the fix."""
  table = bench_analysis.runs_table(2_500)
  table['tag'] = [f't{i}' for i in range(len(table))]
  table.to_csv(tmp_path / 'runs.csv', index=False)
  code, err = one_line_error(
    capsys,
    attribute.main,
    ['--csv', str(tmp_path / 'runs.csv'), '--metric', 'accuracy', '--factors', 'platform', 'tag'],
  )
  assert code == 2 and err.startswith('error: --factors: ')
  assert 'tag has 10,000 levels' in err and 'GB' in err and 'drop it' in err


def test_design_names_a_confounded_term_from_its_distinct_rows():
  """The rank check runs on the design's distinct rows (a few, whatever the number of runs)."""
  runs = bench_analysis.runs_table(50)
  runs['twin'] = runs['profile']  # no run separates twin from profile
  runs['half'] = (runs['seed'] % 2).astype(str)
  ref = {'profile': 'native', 'twin': 'native', 'half': '0'}
  for factors in (['profile', 'twin'], ['profile', 'twin', 'half']):  # 3 and 6 distinct rows
    with pytest.raises(ValueError, match='--factors: term twin=jax_gpu_default is confounded'):
      attribution.design(runs, factors, ref)
  X = attribution.design(runs, ['platform', 'profile'], {'platform': 'gpu', 'profile': 'native'})
  assert (
    list(X.columns)
    == ['Intercept', 'platform=tpu', 'profile=jax_gpu_default', 'profile=tpu_default']
    and len(X) == 200
  )


# Item 2: analysis.stats at any size.


def test_mann_whitney_method_by_size():
  """Exact where cheap and defined, else the normal approximation scipy uses."""
  rng = np.random.default_rng(3)
  a, b = rng.normal(size=6), rng.normal(size=7)
  u, p, method = stats.mann_whitney(a, b)
  ref = sps.mannwhitneyu(a, b, method='exact')
  assert method == stats.MW_EXACT and (u, p) == (ref.statistic, pytest.approx(ref.pvalue))
  # Ties (discrete accuracies): the exact permutation test over the midranks, by enumeration.
  a, b = np.array([0.70, 0.71, 0.69, 0.72, 0.70]), np.array([0.68, 0.69, 0.70, 0.67, 0.66, 0.69])
  u, p, method = stats.mann_whitney(a, b)
  ranks = sps.rankdata(np.concatenate([a, b]))
  us = [ranks[list(i)].sum() - 15 for i in itertools.combinations(range(11), 5)]
  assert method == stats.MW_PERMUTATION
  assert p == pytest.approx(np.mean([abs(x - 15) >= abs(u - 15) - 1e-9 for x in us]))
  # Large, or ties beyond the enumeration limit: normal, tie- and continuity-corrected.
  for a, b in (
    (rng.normal(size=stats.MW_EXACT_MAX_N + 1), rng.normal(size=50)),
    (rng.integers(0, 9, 40) / 10, rng.integers(0, 9, 40) / 10),
  ):
    u, p, method = stats.mann_whitney(a, b)
    ref = sps.mannwhitneyu(a, b, method='asymptotic', use_continuity=True)
    assert method == stats.MW_NORMAL and (u, p) == (ref.statistic, pytest.approx(ref.pvalue))
  assert stats.mann_whitney(rng.normal(size=100), rng.normal(size=100))[2] == stats.MW_EXACT


def test_stats_at_hundreds_of_seeds_names_the_mann_whitney_method_in_the_tables():
  """2 arms x 400 seeds: the exact test took seconds per pair and grows as n^3 (2 x 1,000 did
  not finish in 300 s); now the normal approximation, named in the pairs table and the CSV."""
  frame = bench_analysis.runs_table(400)
  frame = frame[frame['profile'] == 'native'].drop(columns='seed')  # unpaired: Mann–Whitney
  out = analyse.study_analysis(frame, {}, ['platform'], 'accuracy', margin=0.3)
  pair = out.pairs.iloc[0]
  assert pair['mw_method'] == stats.MW_NORMAL
  a, b = (
    100 * frame.loc[frame['platform'] == arm, 'accuracy'] for arm in (pair['arm_a'], pair['arm_b'])
  )
  assert pair['mw_p'] == pytest.approx(sps.mannwhitneyu(a, b, method='asymptotic').pvalue)
  text = report.render(out, 'md')
  assert f'{stats.MW_NORMAL}' in text.split('## Comparisons: every test')[1]


def test_arm_interval_method_by_size():
  """t below BCA_MIN_N, BCa bootstrap up to BCA_MAX_N, t again from there (the jackknife of the
  BCa interval costs n^2; the intervals agree there): mean_ci returns exactly the t-interval."""
  assert [
    stats.ci_method(n)
    for n in (stats.BCA_MIN_N - 1, stats.BCA_MIN_N, stats.BCA_MAX_N - 1, stats.BCA_MAX_N)
  ] == [stats.T_METHOD, stats.BCA_METHOD, stats.BCA_METHOD, stats.T_METHOD]
  x = np.random.default_rng(4).lognormal(0, 1, stats.BCA_MAX_N)
  low, high, method = stats.mean_ci(x)
  assert method == stats.T_METHOD and (low, high) == stats.t_ci(x)
  bca = stats.bca_ci(x)
  assert abs(bca[0] - low) < 0.05 * (high - low) and abs(bca[1] - high) < 0.05 * (high - low)


def test_prepare_and_arm_table_loop_per_arm_not_per_run(monkeypatch):
  """No iterrows and no Python loop over seeds or runs in stats.prepare / arm_table (at 100,000
  rows each costs seconds to minutes): a group-by is iterated at most once per arm."""
  frame = bench_analysis.runs_table(300)
  frame = pd.concat(
    [frame, frame[frame['profile'] == 'native'].assign(accuracy=lambda f: f['accuracy'] + 0.001)],
    ignore_index=True,
  )  # every native seed twice
  iterated = []
  original = pd_groupby.BaseGroupBy.__iter__

  def counted(self):
    for item in original(self):
      iterated.append(1)
      yield item

  monkeypatch.setattr(pd_groupby.BaseGroupBy, '__iter__', counted)
  monkeypatch.setattr(pd.DataFrame, 'iterrows', lambda self: pytest.fail('iterrows'))
  prep = stats.prepare(frame, ['platform', 'profile'], 'accuracy')
  arms = stats.arm_table(prep)
  assert len(iterated) <= 2 * len(arms)
  assert len(prep.replicates) == 600 and list(arms['n']) == [300] * 4
  native = arms.set_index('arm').loc['gpu, profile=native']
  assert native['within_sd'] == pytest.approx(0.1 / np.sqrt(2)) and native['within_df'] == 300
  assert native['n_runs'] == 600 and native['determinism'] == (
    'seed 0 repeated with a different value'
  )


def test_more_arms_than_a_report_can_compare_is_one_line_naming_group_by(tmp_path, capsys):
  """Grouping by a column of 201 values (201 arms of 2 seeds: 20,100 pairs of tests) is refused
  before any per-arm work, naming --group-by and the fix."""
  table = bench_analysis.runs_table(402)
  table['tag'] = (table['seed'] % 201).astype(str)
  table.to_csv(tmp_path / 'runs.csv', index=False)
  code, err = one_line_error(
    capsys,
    analyse.main,
    ['--csv', str(tmp_path / 'runs.csv'), '--metric', 'accuracy', '--group-by', 'tag'],
  )
  assert code == 2 and err.startswith('error: --group-by: 201 arms (by tag), more than this report')
  assert f'{stats.MAX_ARMS} arms at most: up to 19,900 pairs' in err and 'fewer or coarser' in err


# Item 3: arms defined by every config field that differs.


def test_arms_split_on_every_config_field_that_differs():
  """A learning-rate sweep (0.003 vs 0.002) plus a 4-epoch run: three arms named by their fields
  (once one arm, 'seed 0.0 repeated with a different value'); cadence, paths and the seed do not
  split; a record that predates a config field counts it as its default; seeds print as ints."""
  rows = []
  for seed in (0, 1):
    base = smoke(seed)
    slow = smoke(seed)
    slow.optim.learning_rate = 0.002
    longer = smoke(seed)
    longer.num_epochs = 4
    moved = smoke(seed)  # differs only in what cannot change the result
    moved.log_every_steps, moved.data.manual_dir, moved.checkpoint_every_steps = 7, '/x', 3
    for name, config, acc in (
      ('base', base if seed else moved, 0.90),
      ('slow', slow, 0.85),
      ('long', longer, 0.93),
    ):
      rec = make_record(config, acc + seed / 100)
      if name == 'long' and seed:
        rec['config']['optim'].pop('schedule')  # written before optim.schedule existed
      rows.append(rules.row(f'/r/{name}/{seed}', rec))
  rows.append(rules.row('/r/pending', None))  # no seed: the seed column becomes float
  out = stats.arms_and_pairs(pd.DataFrame(rows), margin=0.5)
  arms = out.arms.set_index('arm')
  assert sorted(arms.index) == [
    'num_epochs=2, optim.learning_rate=0.002',
    'num_epochs=2, optim.learning_rate=0.003',
    'num_epochs=4, optim.learning_rate=0.003',
  ]
  assert list(arms['n']) == [2, 2, 2] and out.replicates.empty
  assert set(arms['seeds']) == {'0 1'} and not arms['determinism'].str.contains('different').any()
  assert {'config.num_epochs', 'config.optim.learning_rate'} <= set(out.group_by)
  for never in (
    'config.seed',
    'config.log_every_steps',
    'config.data.manual_dir',
    'config.checkpoint_every_steps',
    'config.optim.schedule',
  ):
    assert never not in out.group_by, never
  assert not any(c.startswith('config.numerics.') for c in out.group_by)


def test_seeds_print_as_integers_in_every_table(tmp_path, capsys):
  """A CSV whose seed column has a gap (so pandas reads floats): 0 1 2 everywhere, never 0.0."""
  (tmp_path / 'r.csv').write_text(
    'platform,seed,accuracy\ntpu,0,0.70\ntpu,1,0.71\ntpu,1,0.72\ntpu,2,0.69\n'
    'gpu,0,0.70\ngpu,1,0.70\ngpu,2,0.68\ngpu,,0.71\n'
  )
  argv = ['--csv', str(tmp_path / 'r.csv'), '--group-by', 'platform', '--metric', 'accuracy']
  analyse.main(argv)
  text = capsys.readouterr().out
  assert 'seed 1 repeated with a different value' in text and '| tpu | 1 | 2 |' in text
  assert '| 0–2 |' in text and '.0 ' not in text and '.0 |' not in text
  analyse.main(argv + [f'--out={tmp_path}/o'])
  assert (
    (tmp_path / 'o' / 'report_replicates.csv').read_text().splitlines()[1].startswith('tpu,1,2,')
  )
  assert pd.read_csv(tmp_path / 'o' / 'report_arms.csv')['seeds'].tolist() == ['0–2', '0–2']


# The analysis parts of item 9: one line, exit 2.


def test_attribution_with_one_seed_per_arm(tmp_path, capsys):
  """One seed in two arms: 2 runs for 2 coefficients leave no error to estimate (a one-line
  error, exit 2; it was a ZeroDivisionError traceback). One seed in four arms (platform x profile):
  a correct analysis, OLS with HC3 errors on 1 residual df, saying why."""
  path = tmp_path / 'one.csv'
  path.write_text('platform,profile,seed,accuracy\ngpu,native,0,0.70\ngpu,f32,0,0.71\n')
  code, err = one_line_error(
    capsys, attribute.main, ['--csv', str(path), '--factors', 'profile', '--metric', 'accuracy']
  )
  assert code == 2 and err.startswith('error: --factors: 2 usable runs for 2 coefficients')
  path.write_text(
    'platform,profile,seed,accuracy\ngpu,native,0,0.70\ngpu,f32,0,0.71\n'
    'tpu,native,0,0.72\ntpu,f32,0,0.69\n'
  )
  out = attribution.factor_attribution(
    inputs.read_csv(str(path)), ['platform', 'profile'], 'accuracy'
  )
  assert 'HC3' in out.method and 'one seed' in out.method
  assert np.isfinite(out.terms[['ci_low', 'ci_high']].to_numpy()).all()


@pytest.mark.parametrize('content', ['', 'platform,accuracy\n'])
def test_an_empty_csv_is_named_as_the_csv(tmp_path, capsys, content):
  path = tmp_path / 'empty.csv'
  path.write_text(content)
  for main, argv in ((analyse.main, []), (attribute.main, ['--factors', 'platform'])):
    code, err = one_line_error(capsys, main, ['--csv', str(path), '--metric', 'accuracy'] + argv)
    assert code == 2 and err.startswith(f'error: --csv: {path} ') and 'no runs' in err


def test_duplicate_column_names_are_refused(tmp_path, capsys):
  """pandas would read the second 'accuracy' as 'accuracy.1' and analyse the first silently."""
  path = tmp_path / 'dup.csv'
  path.write_text('platform,accuracy,seed,accuracy\ntpu,0.7,0,0.8\ngpu,0.6,0,0.9\n')
  code, err = one_line_error(capsys, analyse.main, ['--csv', str(path), '--metric', 'accuracy'])
  assert code == 2 and err.startswith(f'error: --csv: {path} has duplicate column names: accuracy')


# Item 5: the benchmark runs end to end at a minimal size (nothing is timed here).


def test_bench_analysis_runs_end_to_end(capsys):
  bench_analysis.main(['--sizes', '40'])
  out = capsys.readouterr().out.strip().splitlines()
  assert out[-1].startswith('max_seconds=') and 'failed' not in '\n'.join(out)
  rows = [line for line in out if line.startswith('| 40 |')]
  assert len(rows) == 2 and 'rank test: exact' in rows[0] and rows[1].endswith('| MixedLM |')
  code, err = one_line_error(capsys, bench_analysis.main, ['--sizes', '10'])
  assert code == 2 and err.startswith('error: --sizes: 10 is not a multiple of 4')
