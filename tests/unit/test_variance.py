"""The variance split (analysis/agreement.py): the crossed init × data-order split with
replicates, on simulated runs with known components, against statsmodels MixedLM and against the
naive one-way split."""

import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from analysis import stats

SD = {'init': 1.0, 'data order': 0.6, 'init × data order': 0.0, 'nondeterminism (replicates)': 0.3}


def one_way(frame, value='value', factor='init_seed'):
  """The naive split (the nearest wrong version): one-way random-effects ANOVA by `factor` alone,
  everything else residual. {'between': σ̂²_between, 'within': σ̂²_within}, balanced groups."""
  groups = frame.groupby(factor)[value]
  k, n = groups.ngroups, int(groups.size().iloc[0])
  ms_between = n * np.sum((groups.mean() - frame[value].mean()) ** 2) / (k - 1)
  ms_within = np.sum((frame[value] - groups.transform('mean')) ** 2) / (k * (n - 1))
  return {'between': max((ms_between - ms_within) / n, 0.0), 'within': ms_within}


def simulate(rng, n_init, n_data, n_rep, sd=None):
  """Runs y = 80 + a_init + b_data + (ab) + e with the given sds (default SD)."""
  sd = sd or SD
  a = rng.normal(0, sd['init'], n_init)
  b = rng.normal(0, sd['data order'], n_data)
  ab = rng.normal(0, sd['init × data order'], (n_init, n_data))
  rows = [
    {
      'init_seed': i,
      'data_seed': j,
      'replicate': r,
      'value': 80 + a[i] + b[j] + ab[i, j] + rng.normal(0, sd['nondeterminism (replicates)']),
    }
    for i in range(n_init)
    for j in range(n_data)
    for r in range(n_rep)
  ]
  return pd.DataFrame(rows)


def test_the_split_recovers_planted_components_on_average():
  """Method-of-moments estimates are unbiased: averaged over 300 simulated studies of 8 × 8 cells
  × 2 replicates they land on the planted variances."""
  rng = np.random.default_rng(0)
  found = []
  for _ in range(300):
    y = simulate(rng, 8, 8, 2)['value'].to_numpy().reshape(8, 8, 2)
    found.append(stats.estimates(stats.mean_squares(y), y.shape))
  mean = pd.DataFrame(found).mean()
  for component, sd in SD.items():
    assert mean[component] == pytest.approx(sd**2, abs=0.06), component


def test_one_large_study_is_close_and_the_naive_one_way_split_is_not():
  frame = simulate(np.random.default_rng(1), 30, 30, 3)
  table = stats.variance_components(frame).set_index('component')
  assert table.loc['nondeterminism (replicates)', 'variance'] == pytest.approx(0.09, rel=0.1)
  assert table.loc['data order', 'variance'] == pytest.approx(0.36, rel=0.5)
  assert table.loc['init', 'variance'] == pytest.approx(1.0, rel=0.5)
  assert table['share_pct'].sum() == pytest.approx(100)
  assert table['method'].iloc[0] == stats.VARIANCE_METHOD
  # One-way by init seed: data order lands in the residual, 5× the nondeterminism.
  naive = one_way(frame, factor='init_seed')
  assert naive['within'] > 4 * table.loc['nondeterminism (replicates)', 'variance']


def test_the_split_equals_mixedlm_reml_variance_components():
  """On a balanced design with positive estimates REML (statsmodels MixedLM, crossed effects as
  variance components of one group) and the ANOVA estimates coincide."""
  frame = simulate(np.random.default_rng(0), 6, 6, 3, {**SD, 'init × data order': 0.2})
  table = stats.variance_components(frame).set_index('component')
  assert not table['truncated'].any()
  frame['cell'] = frame['init_seed'].astype(str) + '_' + frame['data_seed'].astype(str)
  frame['group'] = 1
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    fit = sm.MixedLM.from_formula(
      'value ~ 1',
      groups='group',
      re_formula='0',
      data=frame,
      vc_formula={'init': '0 + C(init_seed)', 'data': '0 + C(data_seed)', 'cell': '0 + C(cell)'},
    ).fit(reml=True)
  reml = dict(zip(fit.model.exog_vc.names, fit.vcomp, strict=True))
  assert table.loc['init', 'variance'] == pytest.approx(reml['init'], rel=1e-3)
  assert table.loc['data order', 'variance'] == pytest.approx(reml['data'], rel=1e-3)
  assert table.loc['init × data order', 'variance'] == pytest.approx(reml['cell'], rel=1e-3)
  assert table.loc['nondeterminism (replicates)', 'variance'] == pytest.approx(fit.scale, rel=1e-3)


def test_negative_estimates_are_truncated_and_say_so():
  frame = simulate(np.random.default_rng(3), 4, 4, 2, {**SD, 'init': 0.0, 'data order': 0.0})
  table = stats.variance_components(frame).set_index('component')
  negative = table['estimate'] < 0
  assert negative.any()
  assert (table.loc[negative, 'variance'] == 0).all() and table.loc[negative, 'truncated'].all()


def test_unbalanced_or_unreplicated_designs_are_refused_by_cell():
  frame = simulate(np.random.default_rng(4), 3, 3, 2)
  with pytest.raises(ValueError, match=r'runs per cell: \(0, 0\): 1'):
    stats.variance_components(frame.iloc[1:])
  one = stats.variance_components(frame[frame['replicate'] == 0])  # R = 1: one residual
  assert list(one['component']) == ['init', 'data order', stats.RESIDUAL]


def test_variance_table_per_arm_only_where_the_runs_record_both_seeds():
  frame = simulate(np.random.default_rng(5), 3, 3, 2).rename(
    columns={'init_seed': 'config.init_seed'}
  )
  frame['arm'] = 'a'
  table = stats.split_by_arm(frame)[0]
  assert set(table['arm']) == {'a'} and (table['runs'] == 18).all()
  assert stats.split_by_arm(frame.drop(columns='config.init_seed'))[0].empty
