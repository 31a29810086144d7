"""The report's first page of a one-platform study (issue 37, item 8), on a planted digits fraction
checked by hand: the answer in one sentence (which settings changed the metric, and the churn of
each against the churn between two seeds), the identical-arithmetic row not TOST-tested, a
difference shown inside the margin called "within margin", the noise floor in one clean line."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import agreement, analyse, report, stats
from configs import digits
from tests.support.planted_predictions import prediction
from tests.support.planted_tables import DIGITS, digits_frame

METRIC = 'final.test_accuracy'
SHIFT = {'bf16 activations': 5.0, 'BN/16': 1.0}  # pp: different; shown and within ±2 pp


def label(arm):
  """The declared short label of a digits arm (its override dict)."""
  if arm['numerics.batchnorm_group']:
    return 'BN/16'
  if arm['numerics.compute_dtype'] == 'bfloat16':
    return 'bf16 activations'
  return arm['numerics.profile']


def planted(seeds=8, rng=0):
  """The digits fraction on one CPU: value = 85 + seed effect + SHIFT[arm] + noise 0.1 pp; f32 and
  native are the same arithmetic (equal effective fields, equal values)."""
  rng = np.random.default_rng(rng)
  base = 85 + rng.normal(0, 1.0, seeds)
  rows = []
  for k, arm in enumerate(digits.study_arms(128)):
    name = label(arm)
    noise = np.zeros(seeds) if name in ('native', 'f32') else rng.normal(0, 0.1, seeds)
    arithmetic = 'native' if name == 'f32' else name
    for s in range(seeds):
      rows.append(
        {
          'run': f'/r/cpu/{k}/{s}',
          'status': 'completed',
          'seed': s,
          'platform': 'cpu',
          'device_kind': 'cpu',
          'data.test_size': 400,
          **{f'numerics.requested.{f.split(".")[1]}': v for f, v in arm.items()},
          **{f'{stats.EFFECTIVE}{f}': f'{arithmetic}:{f}' for f in stats.IDENTICAL_FIELDS},
          METRIC: (base[s] + SHIFT.get(name, 0.0) + noise[s]) / 100,
        }
      )
  return pd.DataFrame(rows)


@pytest.fixture(scope='module')
def study():
  """(analysis with planted predictions, raw table, predictions by run): each seed its own model
  (20 % of images moved), each other arm 3 % more; f32 predicts as native."""
  frame = planted()
  out = analyse.study_analysis(frame, DIGITS)
  rng = np.random.default_rng(1)
  seed_model = {s: prediction(0.2, rng) for s in range(8)}
  names = out.arm_info.set_index('arm')['label']
  ref = {s: prediction(0.0, rng, seed_model[s]['predicted']) for s in range(8)}
  loaded = {
    r.run: ref[r.seed]
    if names[r.arm] in ('native', 'f32')
    else prediction(0.03, rng, ref[r.seed]['predicted'])
    for r in out.runs.itertuples()
  }
  out = dataclasses.replace(
    out, agreement=agreement.from_analysis(out, stats.arm_short_labels(out), load=loaded.get)
  )
  return out, frame, loaded


def raw(frame, name):
  """An arm's values by seed (pp), from the raw table."""
  arms = [label(a) for a in digits.study_arms(128)]
  k = arms.index(name)
  rows = frame[frame['run'].str.startswith(f'/r/cpu/{k}/')]
  return (100 * rows.set_index('seed')[METRIC]).sort_index()


def test_the_first_page_answers_in_one_sentence_which_settings_changed_the_model(study):
  out, frame, loaded = study
  line = report.sentence(out)
  d_bf16 = raw(frame, 'bf16 activations') - raw(frame, 'native')
  d_bn = raw(frame, 'BN/16') - raw(frame, 'native')

  def ci(d):
    return (
      d.mean() - sps.t.ppf(0.975, 7) * d.std(ddof=1) / np.sqrt(8),
      d.mean() + sps.t.ppf(0.975, 7) * d.std(ddof=1) / np.sqrt(8),
    )

  lo, hi = ci(d_bf16)
  assert line.startswith(
    '**Answer.** on cpu, bf16 activations '
    f'({d_bf16.mean():+.2f} [{lo:+.2f}, {hi:+.2f}] pp) changed test accuracy '
    '(a difference shown; within ±2 pp not shown); BN/16'
  )
  lo, hi = ci(d_bn)
  assert (
    f'BN/16 ({d_bn.mean():+.2f} [{lo:+.2f}, {hi:+.2f}] pp) changed it, by less than the margin'
    in line
  )
  assert 'the others did not beyond ±2 pp (4 of 6 tested equivalent)' in line
  assert "f32 is the reference's own arithmetic (exactly 0, not tested)" in line
  # churn of each setting against the reference, by hand from the predictions
  table = out.agreement.table
  runs = out.runs.set_index('run')

  def by(arm):
    return {
      runs.loc[r, 'seed']: loaded[r]['predicted'] for r in runs.index if runs.loc[r, 'arm'] == arm
    }

  ref_arm = out.arm_info.loc[out.arm_info['role'] == 'reference', 'arm'].iloc[0]
  churns = [
    100 * np.mean([agreement.churn(by(a)[s], by(ref_arm)[s]) for s in range(8)])
    for a in out.contrasts['arm_a']
    if a not in set(table.loc[table['kind'] == 'identical', 'a'])
  ]
  pooled = table.set_index('kind').loc['seed_all', 'churn_pct']
  assert (
    f'by churn, 6 of 6 settings changed the model: {min(churns):.2g}–{max(churns):.2g} %' in line
  )
  assert (
    f'{min(churns) / pooled:.2g}–{max(churns) / pooled:.2g} × the {pooled:.2g} % between two '
    'seeds of one arm (every one changes fewer predictions than a new seed does)'
  ) in line
  first = report.render(out, 'md').split('## Setup')[0]
  assert first.index(line) < first.index('**Confirmatory') < first.index('Agreement (churn')
  assert 'Same model? Read against the churn between two seeds' in first
  assert 'identical arithmetic exactly 0 (checked)' in first


def test_the_identical_arithmetic_row_is_not_tost_tested(study):
  out, _, _ = study
  rows = report.display_pairs(report.labelled(out, out.contrasts), out.unit)
  (same,) = [r for r in rows if r['verdict'] == 'identical arithmetic']
  assert same['equiv. (Holm TOST)'] == 'not tested' and same['TOST p'] == 'not tested'
  assert same['Welch p'] == 'not tested' and same['Δ A−B (pp)'] == '0.00'


def test_a_difference_shown_inside_the_margin_is_called_within_margin(study):
  out, frame, _ = study
  row = out.contrasts.set_index('label').loc['BN/16']
  d = raw(frame, 'BN/16') - raw(frame, 'native')
  assert row['ci95_low'] > 0 and row['ci90_high'] < 2 and row['diff'] == pytest.approx(d.mean())
  assert row['verdict'] == 'within margin'  # not 'equivalent' alone
  first = report.render(out, 'md').split('## Setup')[0]
  assert '| BN/16 | +1.' in first and 'within margin (a difference shown)' in first
  assert 'within margin = both: a difference shown, inside the margin' in first


def test_the_noise_floor_is_one_clean_line():
  att = analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(6)), DIGITS).attribution
  text = report.noise_text(att)
  assert text.count('noise floor') == 1
  assert (
    'mean paired difference profile=bf16_noise − profile=f32 at batchnorm_group=0, '
    'compute_dtype=float32'
  ) in text
  for p in ('cpu', 'gpu'):
    f = att.noise[p]
    assert f'{p} ±{f.half:.3f} pp (sd {f.sd:.3f}, 6 seeds)' in text


def test_without_declared_contrasts_the_sentence_counts_the_pairs():
  out = analyse.study_analysis(digits_frame(('cpu', 'gpu'), seeds=range(4)), {})
  line = report.sentence(out)
  assert f'{len(out.pairs)} pairs of arms compared on test accuracy (no declared contrasts' in line
  assert len(line) < 400 and 'profile=' not in line
