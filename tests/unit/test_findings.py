"""The shipped result: the verdicts of results/digits_h100_cpu.csv, and analysis.export's CSV
reads back to the tables of the runs it came from."""

import os

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from analysis import analyse, declaration, export, inputs
from tests.support.planted_runs import SMALL, fake_run

CSV = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
STUDY = os.path.join(ROOT, 'results', 'digits_h100_cpu.study.json')


@pytest.mark.parametrize('margin, verdict', [(2, 'no gap'), (0.5, 'inconclusive')])
def test_the_verdicts_of_the_shipped_csv(margin, verdict):
  """The shipped result (the README's "What it finds on an H100 and a CPU"): the declared seeds at
  the declared ±2 pp give no gap; all 16 seeds give no gap at ±2 and inconclusive at ±0.5."""
  out = analyse.study_analysis(inputs.read_csv(CSV), declaration.load(STUDY), margin=margin)
  assert [d.verdict for d in out.attribution.decomposition] == [verdict]
  assert [d.verdict for d in out.confirmatory.attribution.decomposition] == ['no gap']
  assert set(out.arms['n']) == {16} and len(out.runs) == 256
  assert out.software.confounds[:3] == ['flax', 'jax', 'jaxlib']


def test_export_reads_back_to_the_tables_of_its_runs(tmp_path, capsys):
  rng = np.random.default_rng(5)
  for platform in ('gpu', 'cpu'):
    for profile in ('native', 'f32', 'jax_gpu_default', 'bf16_noise'):
      for seed in range(3):
        fake_run(tmp_path / 'data' / platform, platform, profile, seed, 0.9 + rng.normal(0, 0.004))
  roots = [str(tmp_path / 'data' / 'gpu'), str(tmp_path / 'data' / 'cpu')]
  out_csv = str(tmp_path / 'out' / 'both.csv')
  export.main(['--runs', *roots, '--out', out_csv, '--study', STUDY])
  assert 'wrote' in capsys.readouterr().out
  assert declaration.load(export.study_path(out_csv)) == declaration.load(STUDY)
  table = pd.read_csv(out_csv)
  assert table['run'].str.match(r'^(gpu|cpu)/[a-z0-9_]+/seed\d$').all() and len(table) == 24
  direct = analyse.study_analysis(inputs.load_runs(roots), SMALL)
  again = analyse.study_analysis(inputs.read_csv(out_csv), SMALL)
  for name in ('arms', 'contrasts'):  # an empty text field reads back from a CSV as missing
    pd.testing.assert_frame_equal(
      getattr(direct, name).replace('', np.nan), getattr(again, name), check_dtype=False
    )
  assert direct.attribution.decomposition[0].R.estimate == pytest.approx(
    again.attribution.decomposition[0].R.estimate, abs=1e-12
  )
  assert direct.software == again.software
  with pytest.raises(SystemExit) as e:
    export.main(['--runs', *roots, '--out', str(tmp_path / 'both.txt')])
  assert e.value.code == 2 and capsys.readouterr().err.startswith('error: --out=')
