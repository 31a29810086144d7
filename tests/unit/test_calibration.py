"""Calibration and per-class differences (analysis/agreement.py) on hand-computed tiny tables
and planted runs."""

import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from analysis import agreement, inputs, stats
from tests.conftest import ROOT

CSV = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')


def test_ece_by_hand_on_a_tiny_table():
  confidence = [0.10, 0.12, 0.55, 0.58, 0.95, 0.99, 0.30]
  correct = [0, 1, 1, 0, 1, 1, 1]
  # 15 bins of width 1/15: (0.10, 0.12) in bin 1, (0.55, 0.58) in bin 8, (0.95, 0.99) in bin 14,
  # 0.30 in bin 4; Σ n_b/n |acc_b − conf_b|:
  by_hand = (2 * abs(0.5 - 0.11) + 2 * abs(0.5 - 0.565) + 2 * abs(1 - 0.97) + abs(1 - 0.30)) / 7
  assert agreement.ece(confidence, correct) == pytest.approx(by_hand, abs=1e-12)
  unweighted = (abs(0.5 - 0.11) + abs(0.5 - 0.565) + abs(1 - 0.97) + abs(1 - 0.30)) / 4
  assert abs(by_hand - unweighted) > 0.05  # the nearest wrong version: bins weighted equally
  # One bin (bins=1) is |accuracy − mean confidence|:
  assert agreement.ece(confidence, correct, bins=1) == pytest.approx(
    abs(np.mean(correct) - np.mean(confidence))
  )


def test_nll_of_classification_and_of_the_attribute_bits():
  pred = {
    'label': np.array([0, 1, 2, 3]),
    'predicted': np.array([0, 1, 2, 0]),
    'p_predicted': np.array([0.5, 0.8, 1.0, 0.6], np.float32),
    'p_label': np.array([0.5, 0.25, 1.0, 0.0], np.float32),
  }
  c = agreement.run_calibration(pred)
  tiny = np.finfo(np.float32).tiny
  assert c['nll'] == pytest.approx(-(np.log(0.5) + np.log(0.25) + 0 + np.log(tiny)) / 4)
  assert c['accuracy'] == 0.75
  bits = {
    'label': np.array([[1, 0], [0, 0]]),
    'predicted': np.array([[1, 1], [0, 0]]),
    'probability': np.array([[0.9, 0.7], [0.15, 0.35]], np.float32),
  }
  b = agreement.run_calibration(bits)
  p = np.array([[0.9, 0.7], [0.15, 0.35]], np.float32).astype(np.float64)
  by_hand = -(np.log(p[0, 0]) + np.log(1 - p[0, 1]) + np.log(1 - p[1, 0]) + np.log(1 - p[1, 1])) / 4
  assert b['nll'] == pytest.approx(by_hand, rel=1e-6) and b['accuracy'] == 0.75
  assert b['ece'] == pytest.approx(
    agreement.ece([0.9, 0.7, 0.85, 0.65], [1, 0, 1, 1]), rel=1e-6
  )  # off bin edges


def planted(arm, seed, accuracy_by_class, rng, n=600):
  """A run whose class c is predicted right with probability accuracy_by_class[c]."""
  label = rng.integers(0, len(accuracy_by_class), n)
  right = rng.random(n) < np.asarray(accuracy_by_class)[label]
  predicted = np.where(right, label, (label + 1) % len(accuracy_by_class))
  p = rng.uniform(0.5, 1.0, n).astype(np.float32)
  pred = {
    'label': label.astype(np.int32),
    'predicted': predicted.astype(np.int32),
    'p_predicted': p,
    'p_label': np.where(right, p, 1 - p).astype(np.float32),
  }
  return {
    'run': f'/r/{arm}/{seed}/{rng.integers(1 << 30)}',
    'arm': arm,
    'seed': seed,
    'platform': 'cpu',
    'pred': pred,
  }


def test_calibration_per_arm_averages_replicates_then_a_t_interval_over_seeds():
  rng = np.random.default_rng(0)
  entries = [planted('a', s, [0.9, 0.8], rng) for s in range(4)] + [
    planted('a', 0, [0.9, 0.8], rng)
  ]
  runs = agreement.run_table(entries)
  table = agreement.calibration_table(entries).set_index('arm')
  per_seed = runs.groupby('seed')['ece_pct'].mean().to_numpy()
  assert table.loc['a', 'seeds'] == 4
  assert table.loc['a', 'ece_pct'] == pytest.approx(per_seed.mean())
  assert (table.loc['a', 'ece_pct_ci_low'], table.loc['a', 'ece_pct_ci_high']) == pytest.approx(
    sps.t.interval(0.95, 3, per_seed.mean(), sps.sem(per_seed))
  )
  assert table.loc['a', 'ece_binning'] == agreement.ECE_NAME


def test_final_training_loss_beside_accuracy_per_arm():
  out = stats.arms_and_pairs(inputs.read_csv(CSV), all_pairs=False)
  table = agreement.loss_table(out.runs).set_index('arm')
  runs = out.runs
  bn16 = runs.loc[
    (runs['platform'] == 'cpu') & (runs['numerics.requested.batchnorm_group'].astype(str) == '16'),
    'arm',
  ].iloc[0]
  assert table.loc[bn16, 'seeds'] == 16
  assert table.loc[bn16, 'train_loss'] == pytest.approx(
    runs.loc[runs['arm'] == bn16, 'final.train_loss'].mean()
  )
  assert table.loc[bn16, 'test_accuracy_pct'] == pytest.approx(
    runs.loc[runs['arm'] == bn16, 'value'].mean()
  )
  assert table['train_loss_ratio'].min() == 1.0
  assert agreement.loss_table(out.runs.drop(columns='final.train_loss')).empty


def test_per_class_differences_paired_over_seeds_with_holm_as_statsmodels():
  rng = np.random.default_rng(1)
  entries = []
  for s in range(6):
    entries += [
      planted('a', s, [0.95, 0.8, 0.7, 0.9], rng),
      planted('b', s, [0.55, 0.8, 0.72, 0.9], rng),
    ]
  table = agreement.class_differences(entries, 'a', 'b')

  def acc(arm, s):
    return agreement.class_accuracy(
      next(e['pred'] for e in entries if e['arm'] == arm and e['seed'] == s)
    )

  d = 100 * np.array([acc('a', s) - acc('b', s) for s in range(6)])
  p = sps.ttest_1samp(d, 0.0, axis=0).pvalue
  assert table['diff_pp'].to_numpy() == pytest.approx(d.mean(axis=0))
  assert table['p'].to_numpy() == pytest.approx(p)
  assert table['p_holm'].to_numpy() == pytest.approx(multipletests(p, method='holm')[1])
  assert table['different'].tolist() == [True, False, False, False]
  assert (table['p_holm'] >= table['p']).all() and (table['p_holm'] > table['p']).any()


def test_attribute_accuracy_per_attribute_and_too_few_seeds():
  pred = {'label': np.array([[1, 0, 1], [0, 0, 1]]), 'predicted': np.array([[1, 1, 1], [0, 1, 0]])}
  assert agreement.class_accuracy(pred).tolist() == [1.0, 0.0, 0.5]
  rng = np.random.default_rng(2)
  one_seed = [planted('a', 0, [0.9, 0.9], rng), planted('b', 0, [0.9, 0.9], rng)]
  assert agreement.per_class_table(one_seed, [('a', 'b')]).empty
  assert list(agreement.per_class_table(one_seed, [('a', 'b')])) == list(
    agreement.PER_CLASS_COLUMNS
  )
  assert isinstance(agreement.per_class_table([], []), pd.DataFrame)
