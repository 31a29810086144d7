"""The shipped CSV's analysis gives the numbers of the code before the consolidation (issue 41):
attribution_decomposition.csv, report_contrasts.csv and report_arms.csv of results/ re-derived and
compared, to 1e-12, with the tables that code wrote (tests/data/shipped/, at the declared margin of
2 pp and at --margin 0.5). One change is on purpose (issue 42's one zero-variance rule): the
contrast whose differences are all 0 (identical arithmetic) now has the exact paired_t 0 and p 1
where the code before left them empty; it is asserted as such, every other cell as before."""

import os

import numpy as np
import pandas as pd
import pytest

from analysis import analyse, declaration, inputs
from tests.conftest import ROOT

CSV = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
EXPECTED = os.path.join(ROOT, 'tests', 'data', 'shipped')


def same(got, expected, name):
  """The tables equal: columns, text cells, and numbers to 1e-12 (NaN where NaN)."""
  assert list(got.columns) == list(expected.columns), name
  assert got.shape == expected.shape, name
  numbers = expected.select_dtypes('number').columns
  np.testing.assert_allclose(
    got[numbers].to_numpy(float),
    expected[numbers].to_numpy(float),
    rtol=0,
    atol=1e-12,
    err_msg=name,
  )
  text = [c for c in expected.columns if c not in numbers]
  pd.testing.assert_frame_equal(got[text].astype(str), expected[text].astype(str), obj=name)


@pytest.mark.parametrize('margin', [2, 0.5])
def test_the_shipped_tables_are_the_numbers_of_before(margin, tmp_path):
  out = analyse.study_analysis(
    inputs.read_csv(CSV), declaration.load(CSV.replace('.csv', '.study.json')), margin=margin
  )
  tables = analyse.tables(out)
  for name in ('attribution_decomposition', 'report_contrasts', 'report_arms'):
    tables[f'{name}.csv'].to_csv(tmp_path / name, index=False)  # as the command writes it
    got = pd.read_csv(tmp_path / name)
    stored = f'{name}_margin{margin:g}.csv' if name != 'report_arms' else 'report_arms.csv'
    expected = pd.read_csv(os.path.join(EXPECTED, stored))
    if name == 'report_contrasts':
      exact = expected['identical'] & (expected['diff'] == 0)
      assert exact.sum() == 1 and expected.loc[
        exact, ['paired_t', 'paired_p', 'test_p']
      ].isna().all(None)
      assert (got.loc[exact, ['paired_t', 'paired_p', 'test_p']].to_numpy() == [[0, 1, 1]]).all()
      expected.loc[exact, ['paired_t', 'paired_p', 'test_p']] = [0.0, 1.0, 1.0]
    same(got, expected, name)
