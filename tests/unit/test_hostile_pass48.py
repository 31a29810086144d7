"""Hostile pass, round 48 (issue 42): inputs that gave an exit 0 and a wrong number or sentence.
Each is planted from the shipped digits CSV (seeds 0–5, 96 runs) and checked against the
unchanged table's analysis, or refused in one line with nothing written."""

import os

import numpy as np
import pandas as pd
import pytest

from analysis import analyse, attribute
from tests.conftest import ROOT
from tests.support.commands import cli_error

SHIPPED = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
STUDY = os.path.join(ROOT, 'results', 'digits_h100_cpu.study.json')
NUMBERS = ['diff', 'ci95_low', 'ci95_high', 'ci90_low', 'ci90_high', 'test_p', 'tost_p']


@pytest.fixture(scope='module')
def small():
  frame = pd.read_csv(SHIPPED)
  return frame[frame['seed'] < 6].reset_index(drop=True)


def run(tmp_path, frame, *flags, name='v'):
  """(report.md, report_contrasts.csv, report_arms.csv) of `analysis.analyse` on `frame`."""
  path, out = tmp_path / f'{name}.csv', tmp_path / name
  frame.to_csv(path, index=False)
  analyse.main(['--csv', str(path), '--out', str(out), *flags])
  read = [
    pd.read_csv(out / f) if (out / f).exists() else None
    for f in ('report_contrasts.csv', 'report_arms.csv')
  ]
  return ((out / 'report.md').read_text(), *read)


def same_numbers(a, b):
  for col in NUMBERS:
    assert np.allclose(a[col], b[col], rtol=0, atol=1e-9, equal_nan=True), col


def test_a_spreadsheet_round_trip_gives_the_analysis_of_the_table_it_came_from(small, tmp_path):
  """Levels written 0.0/16.0 (the noise floor matched text: 'no noise floor'), a status
  'completed ' (every gpu run excluded), no seed column but config.seed (contrasts unpaired while
  the gap paired), accuracies in percent (a lattice of 0.00278 'units')."""
  study = ['--study', STUDY]
  md, contrasts, arms = run(tmp_path, small, *study, name='control')
  assert 'cpu ±' in md and contrasts['lattice'].eq(100 / 360).all()
  floats = small.copy()
  for c in [c for c in small.columns if c.endswith('batchnorm_group')]:
    floats[c] = floats[c].astype(float)
  spaced = small.assign(status=np.where(small['platform'] == 'gpu', 'completed ', 'completed'))
  no_seed = small.drop(columns=['seed'])
  percent = small.assign(**{'final.test_accuracy': small['final.test_accuracy'] * 100})
  for name, frame in (('floats', floats), ('spaced', spaced), ('seed', no_seed), ('pct', percent)):
    md_v, contrasts_v, arms_v = run(tmp_path, frame, *study, name=name)
    same_numbers(contrasts, contrasts_v)
    assert list(arms_v['n']) == list(arms['n']), name
    floor = md.split('noise floor (95% half-width')[1].split(';')[0]
    assert floor in md_v, name
    assert contrasts_v['lattice'].eq(100 / 360).all(), name  # one test image, in pp
    assert ' units' not in md_v.split('## Setup')[0], name


def test_a_declared_arm_that_matches_several_arms_or_the_noise_arm_itself_is_refused(
  small, tmp_path, capsys
):
  import json

  declared = json.loads(open(STUDY).read())
  path = tmp_path / 'runs.csv'
  small.to_csv(path, index=False)
  cases = {
    'reference': (
      {**declared, 'reference': {'profile': 'native'}},
      '--study: reference matches 3 arms on cpu (BN/0, bf16 activations; BN/0, f32 activations; '
      'BN/16, f32 activations); give its level of batchnorm_group, compute_dtype too',
    ),
    'noise_of': (
      {**declared, 'noise_of': {'profile': 'bf16_noise', 'batchnorm_group': '0'}},
      '--study: noise_of names the noise arm itself',
    ),
  }
  for name, (study, message) in cases.items():
    (tmp_path / f'{name}.json').write_text(json.dumps(study))
    out = tmp_path / f'out_{name}'
    argv = ['--csv', str(path), '--study', str(tmp_path / f'{name}.json'), '--out', str(out)]
    lines = cli_error(capsys, analyse.main, argv)
    assert message in lines[-1] and not out.exists(), lines


def test_a_metric_not_named_as_an_accuracy_needs_a_margin_in_its_own_units(small, tmp_path, capsys):
  """The declared ±2 pp applied to a loss ('13 of 13 equivalent' on losses of 0.13–0.19), and the
  default 0.5 'pp' to a fraction named top1 (a 3 pp drop 'within margin')."""
  path = tmp_path / 'runs.csv'
  small.assign(top1=small['final.test_accuracy']).to_csv(path, index=False)
  for argv in (
    ['--csv', str(path), '--study', STUDY, '--margin-reason', 'a reviewer asked'],
    ['--csv', str(path), '--study', STUDY, '--metric', 'final.test_loss'],
    ['--csv', str(path), '--metric', 'top1', '--group-by', 'platform'],
  ):
    lines = cli_error(capsys, analyse.main, [*argv, '--out', str(tmp_path / 'o')])
    said = 'given without --margin' if '--margin-reason' in argv else 'is not an accuracy by name'
    assert said in lines[-1] and not (tmp_path / 'o').exists(), lines
  md, *_ = run(tmp_path, small, '--study', STUDY, '--metric', 'final.test_loss', '--margin', '0.05')
  assert 'No confirmatory answer: the declared margin (pp) is not one of final.test_loss' in md
  assert '±0.05 units' in md


def test_runs_pooled_by_group_by_are_not_replicates_of_each_other(small, tmp_path):
  """--group-by platform pools a platform's 8 numerics arms: 8 runs of one seed are 8 configs,
  not one model trained 8 times (they were: 'within-seed sd 0.65', 'deterministic: no')."""
  _, _, arms = run(tmp_path, small, '--group-by', 'platform', '--all-pairs')
  cpu = arms.set_index('arm').loc['cpu']
  assert cpu['n_runs'] == 48 and np.isnan(cpu['within_sd']) and str(cpu['deterministic']) == 'True'


def test_one_profile_emulating_both_platforms_gives_a_numerics_part_of_exactly_0(
  small, tmp_path, capsys
):
  path, out = tmp_path / 'runs.csv', tmp_path / 'att'
  small.to_csv(path, index=False)
  attribute.main(
    ['--csv', str(path), '--factors', 'platform', 'profile', 'batchnorm_group', 'compute_dtype']
    + ['--reference', 'profile=native', 'batchnorm_group=0', 'compute_dtype=float32']
    + ['--native', 'profile=native', '--platform-profile', 'gpu=f32', 'cpu=f32', '--margin', '2']
    + ['--out', str(out)]
  )
  gap = pd.read_csv(out / 'attribution_gap.csv').set_index('key')
  assert gap.loc['N', 'estimate'] == 0 and gap.loc['N_A', 'estimate'] == 0  # it was −95 pp
  assert gap.loc['R', 'estimate'] == pytest.approx(gap.loc['G', 'estimate'], abs=1e-12)


def test_a_semicolon_csv_is_one_line_and_a_study_dot_json_in_capitals_is_read(
  small, tmp_path, capsys
):
  from analysis import declaration

  path = tmp_path / 'runs.csv'
  small.head(4).to_csv(path, index=False, sep=';', decimal=',')
  lines = cli_error(capsys, analyse.main, ['--csv', str(path), '--out', str(tmp_path / 'o')])
  assert lines == [f'error: --csv: {path} is separated by ";"; save it with commas (a CSV)']
  upper = tmp_path / 'study.JSON'
  upper.write_text(open(STUDY).read())
  assert declaration.load(str(upper)) == declaration.load(STUDY)  # was: 'no config file'


def test_a_platform_without_the_declared_seeds_is_named_in_the_confirmatory_line(small):
  """gpu renumbered to seeds 100–105: the confirmatory re-analysis (declared seeds 0–5) has cpu
  only, and read '6 contrasts tested: 6 equivalent' without a word on gpu − cpu."""
  from analysis import declaration, report

  frame = small.assign(seed=small['seed'] + 100 * (small['platform'] == 'gpu'))
  out = analyse.study_analysis(frame, declaration.load(STUDY))
  line = ' '.join(report.scope_lines(out))
  assert '; not analysed: gpu − cpu: gpu ran none of the declared seeds)' in line, line
