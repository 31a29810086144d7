"""The shipped result: what analysis.findings makes of results/digits_h100_cpu.csv (the README's
"What it finds on an H100 and a CPU"), and analysis.export's CSV reads back to the tables of the
runs it came from."""

import os

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from analysis import analyse, declaration, export, findings, inputs
from tests.support.planted_runs import SMALL, fake_run

CSV = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
STUDY = os.path.join(ROOT, 'results', 'digits_h100_cpu.study.json')


def test_the_section_of_the_shipped_csv(monkeypatch, capsys):
  """The README section analysis.findings makes of results/ (its computation; the maintainer
  writes it into README.md with --write-readme)."""
  monkeypatch.chdir(ROOT)  # the section names the files as the command gives them
  findings.main(
    [
      '--csv',
      'results/digits_h100_cpu.csv',
      '--study',
      'results/digits_h100_cpu.study.json',
      '--margins',
      '2',
      '0.5',
    ]
  )
  section = capsys.readouterr().out
  assert '| ±2 pp |' in section and '| ±0.5 pp |' in section and 'residual, 90% CI' in section
  assert '16 seeds per arm, 256 runs' in section and 'flax, jax, jaxlib' in section
  assert section.count('**no gap**') == 2 + 2 and section.count('**inconclusive**') == 1 + 1
  assert findings.FIRST not in section and findings.LAST not in section


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
