"""Inputs that must not fool the analysis (issue 29), the output side: margins checked where they
enter, one-line errors with nothing written, locale-proof output, the LaTeX labels and the empty
pairs table, and no JAX in the analysis commands. Planted run folders and CSVs, no training (the
input side: tests/integration/test_hostile_analysis.py)."""

import dataclasses
import io
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from etils import epath

from analysis import analyse, attribute, export, stats
from tests.conftest import ROOT
from tests.support.commands import cli_error, run_module
from tests.support.hostile_inputs import METRIC, accuracy_csv, fractions
from tests.support.planted_runs import plant

# 3. Margins, checked where they enter.


@pytest.mark.parametrize('margin', ['inf', '1e308', 'true', '0', '-1', 'nan', 'abc'])
def test_a_bad_margin_flag_is_one_line_naming_the_flag(tmp_path, capsys, margin):
  path = accuracy_csv(tmp_path / 'r.csv', fractions())
  lines = cli_error(
    capsys, analyse.main, ['--csv', path, '--metric', 'accuracy', '--margin', margin]
  )
  assert len(lines) == 1 and lines[0].startswith('error: argument --margin: ')
  lines = cli_error(
    capsys,
    attribute.main,
    ['--csv', path, '--metric', 'accuracy', '--factors', 'platform', '--margin', margin],
  )
  assert len(lines) == 1 and lines[0].startswith('error: argument --margin: ')


@pytest.mark.parametrize('margin', [float('inf'), 1e308, True, 0, -0.5, 'abc', '0.5'])
def test_a_bad_study_json_margin_names_the_file_and_field(tmp_path, capsys, margin):
  root = plant(tmp_path / 'root', seeds=(0, 1))
  (tmp_path / 'root' / 'study.json').write_text(json.dumps({'margin': margin}))
  lines = cli_error(capsys, analyse.main, ['--runs', root])
  assert len(lines) == 1 and lines[0].startswith(f'error: {root}/study.json: margin: '), lines
  assert '--margin' not in lines[0]
  study = tmp_path / 's.json'
  study.write_text(json.dumps({'margin': margin}))
  path = accuracy_csv(tmp_path / 'r.csv', fractions())
  lines = cli_error(
    capsys, analyse.main, ['--csv', path, '--metric', 'accuracy', '--study', str(study)]
  )
  assert lines[0].startswith(f'error: {study}: margin: ')


def test_margin_choice_names_where_each_margin_came_from():
  with pytest.raises(ValueError, match=r"^the study's declared margin .*: True is not a number"):
    stats.margin_choice(None, None, True)
  with pytest.raises(ValueError, match=r'^--margin: inf is not a usable margin'):
    stats.margin_choice(float('inf'), None, 0.5)
  assert stats.margin_choice(100, None, 0.5)[0] == 100.0


# 4. One-line errors, nothing written; an unreadable run folder is excluded, not fatal.


def test_an_unlistable_run_folder_is_excluded_with_its_reason(tmp_path, capsys, monkeypatch):
  root = plant(tmp_path / 'root')
  locked = f'{root}/bfloat16/s2'
  listing = type(epath.Path(root)).iterdir

  def iterdir(self):
    if str(self) == locked:
      raise PermissionError(13, 'Permission denied', locked)
    return listing(self)

  monkeypatch.setattr(type(epath.Path(root)), 'iterdir', iterdir)
  out_dir = tmp_path / 'out'
  analyse.main(['--runs', root, '--out', str(out_dir)])
  page = capsys.readouterr().out.split('## Setup')[0]
  assert '**Excluded:** 1 of 6 runs (1 unreadable: PermissionError: ' in page
  excluded = pd.read_csv(out_dir / 'report_excluded.csv')
  assert excluded['run'].tolist() == [locked] and excluded['status'].tolist() == ['unreadable']


@pytest.mark.parametrize(
  'main, argv',
  [
    (analyse.main, ['--runs', 'gs://bucket/study', '--out', '{out}']),
    (export.main, ['--runs', 'gs://bucket/study', '--out', '{out}/runs.csv']),
    (attribute.main, ['--runs', 'gs://bucket/study', '--factors', 'platform', '--out', '{out}']),
  ],
)
def test_a_bucket_root_without_gcsfs_is_one_line(tmp_path, capsys, monkeypatch, main, argv):
  exists = type(epath.Path('/')).exists

  def no_gcsfs(self):
    if str(self).startswith('gs://'):
      raise ImportError('Install gcsfs to read gs:// paths')
    return exists(self)

  monkeypatch.setattr(type(epath.Path('/')), 'exists', no_gcsfs)
  out = tmp_path / 'out'
  lines = cli_error(capsys, main, [a.format(out=out) for a in argv])
  assert len(lines) == 1 and 'gs://bucket/study' in lines[0] and 'pip install gcsfs' in lines[0]
  assert not out.exists()


def test_bad_csv_input_writes_nothing(tmp_path, capsys):
  values = fractions()
  values[0] = 93.0
  out = tmp_path / 'out'
  cli_error(
    capsys,
    analyse.main,
    ['--csv', accuracy_csv(tmp_path / 'r.csv', values), '--metric', 'accuracy', '--out', str(out)],
  )
  assert not out.exists()


@pytest.mark.parametrize(
  'main, extra', [(analyse.main, []), (attribute.main, ['--factors', 'platform'])]
)
def test_an_out_that_is_a_file_is_one_line_before_any_compute(tmp_path, capsys, main, extra):
  (tmp_path / 'a_file').write_text('x')
  lines = cli_error(
    capsys,
    main,
    [
      '--csv',
      accuracy_csv(tmp_path / 'r.csv', fractions()),
      '--metric',
      'accuracy',
      '--out',
      str(tmp_path / 'a_file'),
      *extra,
    ],
  )
  assert lines == [
    f'error: --out {tmp_path}/a_file is a file; give a folder (it is made when missing)'
  ]


# 5. Output under a non-UTF-8 locale.


def test_the_report_prints_under_the_c_locale(tmp_path):
  path = accuracy_csv(tmp_path / 'r.csv', fractions())
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONIOENCODING', 'LANG', 'LC_CTYPE')}
  env.update(LC_ALL='C', PYTHONUTF8='0')
  done = run_module(
    ['analysis.analyse', '--csv', path, '--metric', 'accuracy', '--out', str(tmp_path / 'out')], env
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert '\\xb1' in done.stdout and 'Traceback' not in done.stderr  # '±', escaped
  assert '±' in (tmp_path / 'out' / 'report.md').read_text(encoding='utf-8')


def test_locale_proof_escapes_what_the_stream_cannot_encode(monkeypatch):
  raw = io.BytesIO()
  stream = io.TextIOWrapper(raw, encoding='ascii')
  monkeypatch.setattr(sys, 'stdout', stream)
  analyse.locale_proof()
  print('±0.5 pp')
  stream.flush()
  assert raw.getvalue() == b'\\xb10.5 pp\n'


# 6. The empty pairs table and the LaTeX labels.


def small_out(source):
  frame = pd.DataFrame(
    {
      'run': [f'{source}:{i}' for i in range(8)],
      'platform': ['a', 'b'] * 4,
      'seed': [i // 2 for i in range(8)],
      METRIC: 0.8 + 0.001 * np.arange(8),
    }
  )
  return analyse.study_analysis(frame, {}, ['platform'], METRIC, source=source)


def test_a_table_without_columns_is_not_written_and_said(tmp_path, capsys):
  out = small_out('x.csv')
  out = dataclasses.replace(out, pairs=pd.DataFrame())  # declared contrasts only: no pair tested
  tables = {name: analyse.tables(out)[name] for name in ('report_pairs.csv', 'report_excluded.csv')}
  files = analyse.write_csv(tables, str(tmp_path), analyse.SKIP_EMPTY, analyse.NOTES)
  assert not (tmp_path / 'report_pairs.csv').exists()
  assert 'note: report_pairs.csv not written: no pairs tested' in capsys.readouterr().err
  assert str(tmp_path / 'report_excluded.csv') in files
  assert (tmp_path / 'report_excluded.csv').read_text().strip() == 'run,status,reason'


def test_two_studies_latex_labels_differ(tmp_path):
  labels = []
  for source in (f'{tmp_path}/digits_h100_cpu.csv', 'runs/celeba'):
    tex = analyse.render(small_out(source), 'latex')
    labels.append(
      {line.split('{')[1].rstrip('}') for line in tex.splitlines() if line.startswith(r'\label{')}
    )
  assert labels[0] and not labels[0] & labels[1]
  assert all(label.startswith('tab:digits-h100-cpu-') for label in labels[0])
  assert all(label.startswith('tab:celeba-') for label in labels[1])


# 7. Memory: the analysis does not load JAX or Orbax.


def test_the_analysis_commands_do_not_import_jax():
  code = (
    'import sys; import analysis.analyse, analysis.attribute, analysis.draw, analysis.export; '
    "print(sorted(m for m in ('jax', 'orbax', 'tensorflow') if m in sys.modules))"
  )
  done = subprocess.run(
    [sys.executable, '-c', code],
    cwd=ROOT,
    env={**os.environ, 'PYTHONPATH': ROOT},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0 and done.stdout.strip() == '[]', done.stderr[-2000:]
