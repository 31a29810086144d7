"""`python -m analysis.analyse --csv ... --out OUT` on a planted three-platform CSV (tpu, gpu, cpu):
one attribution_decomposition.csv row per platform pair, tpu − gpu first, each G checked against
the raw CSV by hand; the first page asks the declared question; --compare overrides the declared
pairs and says the analysis is exploratory. One run of the command per case, read by many
assertions."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from analysis import analyse as analyse_command
from tests.conftest import ROOT
from tests.support.planted_platforms import DECLARED, METRIC, PROFILE, THREE, planted

COLUMNS = ['platform_a', 'platform_b', 'G', 'G_ci_low', 'G_ci_high', 'N', 'R', 'share', 'verdict']


def analyse(tmp, name, declared, extra=()):
  """Run the command on the planted CSV with `declared` as its study.json; (report.md, the
  decomposition CSV, stderr)."""
  csv, study, out = tmp / 'three.csv', tmp / f'{name}.study.json', tmp / name
  if not csv.exists():
    planted(THREE, seeds=8).to_csv(csv, index=False)
  study.write_text(json.dumps(declared))
  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'analysis.analyse',
      '--csv',
      str(csv),
      '--study',
      str(study),
      '--out',
      str(out),
      *extra,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'MPLBACKEND': 'Agg'},
  )
  assert done.returncode == 0, done.stderr[-2000:]
  return (
    (out / 'report.md').read_text(encoding='utf-8'),
    pd.read_csv(out / 'attribution_decomposition.csv'),
    done.stderr,
    csv,
    out,
  )


@pytest.fixture(scope='module')
def every_pair(tmp_path_factory):
  return analyse(tmp_path_factory.mktemp('three'), 'every', DECLARED)


def test_one_row_per_pair_tpu_minus_gpu_first_each_gap_by_hand(every_pair):
  _, table, _, csv, _ = every_pair
  assert list(table.columns[:2]) == ['platform_a', 'platform_b'] and set(COLUMNS) <= set(table)
  assert list(zip(table['platform_a'], table['platform_b'], strict=True)) == [
    ('tpu', 'gpu'),
    ('tpu', 'cpu'),
    ('gpu', 'cpu'),
  ]
  raw = pd.read_csv(csv)
  native = (
    raw[raw[PROFILE] == 'native'].pivot_table(index='seed', columns='platform', values=METRIC) * 100
  )
  for row in table.itertuples():
    g = native[row.platform_a] - native[row.platform_b]
    half = sps.t.ppf(0.975, len(g) - 1) * g.std(ddof=1) / np.sqrt(len(g))
    assert row.G == pytest.approx(g.mean(), abs=1e-9)
    assert (row.G_ci_low, row.G_ci_high) == pytest.approx((g.mean() - half, g.mean() + half))
    assert row.R == pytest.approx(row.G - row.N, abs=1e-9)
  tg, tc, gc = table['G']
  assert abs(tg - tc) > 0.3 and abs(tg - gc) > 0.3  # tpu − gpu is neither pair with cpu


def test_the_first_page_asks_the_question_and_says_how_the_pairs_enter(every_pair):
  report, _, _, _, out = every_pair
  first = report.split('## Setup')[0]
  assert (
    '**Question.** Does training on tpu give the same test accuracy as on gpu, and which '
    'numerical setting explains a difference? Also compared: tpu − cpu, gpu − cpu.'
  ) in first
  assert first.index('**Answer.** tpu − gpu: ') < first.index('**Platform gap**')
  assert (
    "each pair's gap tests (paired t, TOST, signed rank) Holm-adjusted over the 3 pairs" in first
  )
  for gap in ('tpu − gpu', 'tpu − cpu', 'gpu − cpu'):
    assert f'**{gap}: ' in first
  tex = (out / 'report.tex').read_text(encoding='utf-8')
  assert all(
    f'tab:three-gap-{a}-{b}' in tex for a, b in (('tpu', 'gpu'), ('tpu', 'cpu'), ('gpu', 'cpu'))
  )


def test_declared_pairs_and_a_command_line_override(tmp_path):
  report, table, _, _, _ = analyse(tmp_path, 'declared', {**DECLARED, 'compare': [['tpu', 'gpu']]})
  assert list(zip(table['platform_a'], table['platform_b'], strict=True)) == [('tpu', 'gpu')]
  assert 'Also compared' not in report and 'declared (compare)' in report
  report, table, _, _, _ = analyse(
    tmp_path, 'override', {**DECLARED, 'compare': [['tpu', 'gpu']]}, ('--compare', 'gpu:cpu')
  )
  assert list(zip(table['platform_a'], table['platform_b'], strict=True)) == [('gpu', 'cpu')]
  first = report.split('## Setup')[0]
  assert 'Does training on gpu give the same test accuracy as on cpu' in first
  assert '**Exploratory** (platform pairs gpu − cpu from --compare (declared: tpu − gpu))' in first


def test_a_bad_compare_is_one_line_and_writes_nothing(tmp_path, capsys):
  planted(THREE, seeds=3).to_csv(tmp_path / 'three.csv', index=False)
  (tmp_path / 's.json').write_text(json.dumps(DECLARED))
  for argv, message in (
    (['--compare', 'tpu-gpu'], "--compare: 'tpu-gpu' is not A:B"),
    (['--compare', 'tpu:tpu'], 'compares tpu with itself'),
    (['--compare', 'tpu:v5e'], '--compare: no runs on v5e'),
  ):
    with pytest.raises(SystemExit) as e:
      analyse_command.main(
        [
          '--csv',
          str(tmp_path / 'three.csv'),
          '--study',
          str(tmp_path / 's.json'),
          '--out',
          str(tmp_path / 'o'),
          *argv,
        ]
      )
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count('\n') == 1, err
  assert not (tmp_path / 'o').exists()
