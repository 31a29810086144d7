"""Inputs that must not fool the analysis (issue 29): a run counted once however it is reached, a
CSV checked before anything is computed, margins checked where they enter, one-line errors with
nothing written, locale-proof output, the LaTeX labels and the empty pairs table. Planted run
folders and CSVs, no training."""

import io
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from etils import epath

from analysis import analyse, attribute, catalogue, cli, export
from analysis.inputs import csv_input, declaration, results
from analysis.numbers import answer, stats
from analysis.words import report
from runrecord import record
from tests.conftest import ROOT
from tests.support.commands import cli_error, run_module
from tests.support.planted_runs import plant

METRIC = record.DEFAULT_METRIC


@pytest.fixture
def deadline():
  """Fail (instead of hanging) when a test runs past 60 s: a looping walk never returns."""

  def stop(*_):
    raise TimeoutError('the walk did not end')

  before = signal.signal(signal.SIGALRM, stop)
  signal.alarm(60)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, before)


# 1. A run is counted once, however it is reached.


def test_symlink_loops_inside_a_root_count_each_run_once_and_end(tmp_path, deadline):
  root = plant(tmp_path / 'root')
  os.symlink(root, f'{root}/float32/loop')  # back to the root
  os.symlink(f'{root}/bfloat16', f'{root}/bfloat16/s0/self')  # a second loop, inside a run's parent
  os.symlink(f'{root}/float32/s1', f'{root}/alias')  # a second name for one run
  runs = results.load_runs(root)
  assert len(runs) == 6 and runs['run'].is_unique
  assert f'{root}/float32/s1' in set(runs['run']) and f'{root}/alias' not in set(runs['run'])
  out = stats.arms_and_pairs(runs, margin=0.5)
  assert list(out.arms['n_runs']) == [3, 3] and out.replicates.empty


@pytest.mark.parametrize('second', ['link', 'dotdot', 'slash'])
def test_a_root_given_twice_is_read_once(tmp_path, second):
  root = plant(tmp_path / 'root', seeds=(0, 1))
  os.symlink(root, tmp_path / 'link')
  again = {'link': str(tmp_path / 'link'), 'dotdot': f'{tmp_path}/x/../root', 'slash': f'{root}/'}[
    second
  ]
  os.makedirs(tmp_path / 'x', exist_ok=True)
  assert len(results.load_runs([root, again])) == 4
  assert len(results.load_steps([root, again])) == 0  # no metrics.jsonl, and no error


def test_a_run_under_two_roots_is_one_line_naming_both_places(tmp_path, capsys):
  root = plant(tmp_path / 'root', seeds=(0,))
  os.makedirs(tmp_path / 'other')
  os.symlink(f'{root}/float32', tmp_path / 'other' / 'f32')
  lines = cli_error(capsys, analyse.main, ['--runs', root, str(tmp_path / 'other')])
  assert (
    len(lines) == 1 and f'{root}/float32/s0' in lines[0] and f'{tmp_path}/other/f32/s0' in lines[0]
  )
  lines = cli_error(capsys, analyse.main, ['--runs', root, f'{root}/bfloat16'])
  assert (
    len(lines) == 1
    and f'is under both {root} (as {root}/bfloat16/s0) and {root}/bfloat16 ' in lines[0]
  )


# 2. A CSV is checked before anything is computed.


def accuracy_csv(path, values, seeds=None, runs=None, status=None):
  """A CSV of two arms (platform a/b alternating) with the given accuracies."""
  n = len(values)
  table = {
    'run': runs or [f'r{i}' for i in range(n)],
    'platform': ['a', 'b'] * (n // 2) + ['a'] * (n % 2),
    'seed': seeds if seeds is not None else [i // 2 for i in range(n)],
    'accuracy': values,
  }
  if status:
    table['status'] = status
  pd.DataFrame(table).to_csv(path, index=False)
  return str(path)


def fractions(n=12):
  return list(0.80 + 0.001 * np.arange(n))


@pytest.mark.parametrize(
  'bad, line',
  [
    (93.1, 'is in percent while 11 rows are fractions: divide it by 100'),
    (150.0, 'is above 100'),
    (1e308, 'is above 100'),
    (-0.5, 'is negative'),
    (float('inf'), 'is not finite'),
    ('abc', "'abc' is not a number"),
  ],
)
def test_bad_metric_values_are_refused_naming_column_line_and_fix(tmp_path, capsys, bad, line):
  values = fractions()
  values[5] = bad
  path = accuracy_csv(tmp_path / 'r.csv', values)
  lines = cli_error(capsys, analyse.main, ['--csv', path, '--metric', 'accuracy'])
  assert lines[0].startswith(f'error: --csv {path}: accuracy, line 7: ') and line in lines[0], lines
  assert lines[-1].endswith('1 problem(s) above; nothing was analysed')
  lines = cli_error(
    capsys, attribute.main, ['--csv', path, '--metric', 'accuracy', '--factors', 'platform']
  )
  assert line in lines[0]


def test_a_minority_of_fractions_among_percents_is_refused_the_other_way(tmp_path):
  values = [80.0 + i for i in range(12)]
  values[3] = 0.81
  with pytest.raises(
    ValueError,
    match=r'line 5: 0.81 is at most 1 while 11 rows are in percent: a '
    r'fraction\? multiply it by 100; a real percent below 1\? give --scale 1',
  ):
    csv_input.read_csv(accuracy_csv(tmp_path / 'r.csv', values), 'accuracy')


def test_a_negative_loss_is_refused_and_failed_runs_are_not_checked(tmp_path):
  path = tmp_path / 'l.csv'
  pd.DataFrame(
    {
      'platform': ['a', 'b', 'a', 'b'],
      'seed': [0, 0, 1, 1],
      'final.test_loss': [0.3, -0.1, 0.2, np.nan],
    }
  ).to_csv(path, index=False)
  with pytest.raises(
    ValueError, match=r'final.test_loss, line 3: -0.1 is negative, and a loss is >= 0'
  ):
    csv_input.read_csv(str(path), 'test_loss')
  values = fractions()
  values[2] = 'nan-ish'  # a failed run's cell: not analysed, not checked
  status = ['completed'] * 12
  status[2] = 'failed'
  frame = csv_input.read_csv(accuracy_csv(tmp_path / 'f.csv', values, status=status), 'accuracy')
  assert len(frame) == 12


def test_a_repeated_run_id_is_refused_not_averaged(tmp_path):
  runs = [f'r{i}' for i in range(12)]
  runs[7] = 'r3'
  with pytest.raises(ValueError, match=r"run, lines 5, 9: run id 'r3' appears 2 times"):
    csv_input.read_csv(accuracy_csv(tmp_path / 'r.csv', fractions(), runs=runs), 'accuracy')


def test_an_empty_run_id_is_refused(tmp_path):
  runs = [f'r{i}' for i in range(12)]
  runs[1] = runs[3] = None
  with pytest.raises(ValueError, match=r'run, line 3: the run id is empty') as e:
    csv_input.read_csv(accuracy_csv(tmp_path / 'r.csv', fractions(), runs=runs), 'accuracy')
  assert 'run, line 5: the run id is empty' in str(e.value)


@pytest.mark.parametrize(
  'bad, message',
  [('abc', "'abc' is not a whole-number seed"), (2.5, '2.5 is not a whole-number seed')],
)
def test_seeds_must_be_whole_numbers(tmp_path, capsys, bad, message):
  seeds = [i // 2 for i in range(12)]
  seeds[4] = bad
  path = accuracy_csv(tmp_path / 'r.csv', fractions(), seeds=seeds)
  lines = cli_error(capsys, analyse.main, ['--csv', path, '--metric', 'accuracy'])
  assert lines[0].startswith(f'error: --csv {path}: seed, line 6: ') and message in lines[0]


def test_the_attribution_refuses_an_empty_seed_the_study_takes_it_as_a_run_of_its_own(
  tmp_path, capsys
):
  seeds = [i // 2 for i in range(12)]
  seeds[4] = None
  path = accuracy_csv(tmp_path / 'r.csv', fractions(), seeds=seeds)
  lines = cli_error(
    capsys, attribute.main, ['--csv', path, '--metric', 'accuracy', '--factors', 'platform']
  )
  assert lines[0] == (
    f"error: --csv {path}: seed, line 6: the seed is empty; write the run's "
    'integer seed (the attribution groups runs by seed)'
  )
  analyse.main(['--csv', path, '--metric', 'accuracy'])
  assert '## Answer' in capsys.readouterr().out


def test_every_problem_is_its_own_line_up_to_a_limit(tmp_path, capsys):
  values = fractions(40)
  for i in range(0, 30, 2):
    values[i] = 'x'
  path = accuracy_csv(tmp_path / 'r.csv', values)
  lines = cli_error(capsys, analyse.main, ['--csv', path, '--metric', 'accuracy'])
  assert len(lines) == csv_input.MAX_LINES + 2 and '... and 5 more' in lines[-2]
  assert lines[-1].endswith('15 problem(s) above; nothing was analysed')


def test_an_empty_metric_cell_is_excluded_and_counted_on_the_first_page(tmp_path, capsys):
  values = fractions()
  values[4] = None
  analyse.main(['--csv', accuracy_csv(tmp_path / 'r.csv', values), '--metric', 'accuracy'])
  page = capsys.readouterr().out.split('## Setup')[0]
  assert '**Excluded:** 1 of 12 runs (1 no value for accuracy)' in page


def test_the_digits_export_reads_back_unchanged_in_the_columns_it_keeps():
  path = os.path.join(ROOT, 'results', 'digits_h100_cpu.csv')
  full = pd.read_csv(path)
  frame = csv_input.read_csv(path, METRIC, 'seed', ['platform', 'profile'])
  dropped = set(full.columns) - set(frame.columns)
  assert dropped == {
    'final.test_loss',
    'final.train_accuracy',  # final.train_loss: the loss table
    'config.log_every_steps',
    'config.checkpoint_every_steps',
    'config.keep_checkpoints',
    'config.preset',
    'config.data.prefetch',
    'config.data.on_device',
    'config.data.manual_dir',
    'config.data.tfds_dir',
    'config.data.cache_dir',
    'config.distributed.coordinator_address',
    'config.distributed.initialize',
    'config.distributed.num_processes',
    'config.distributed.process_id',
  } & set(full.columns)
  assert isinstance(frame['versions.jax'].dtype, pd.CategoricalDtype)
  for column in frame.columns:
    assert frame[column].astype(str).tolist() == full[column].astype(str).tolist(), column
  # the same answer as from the table read whole
  declared = declaration.load(os.path.join(ROOT, 'results', 'digits_h100_cpu.study.json'))
  a = answer.study_analysis(frame, declared)
  b = answer.study_analysis(full, declared)
  assert report.render(a, 'md') == report.render(b, 'md')


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
  (tmp_path / 'afile').write_text('x')
  lines = cli_error(
    capsys,
    main,
    [
      '--csv',
      accuracy_csv(tmp_path / 'r.csv', fractions()),
      '--metric',
      'accuracy',
      '--out',
      str(tmp_path / 'afile'),
      *extra,
    ],
  )
  assert lines == [
    f'error: --out: {tmp_path}/afile is a file; give a folder (it is created when missing)'
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
  cli.locale_proof()
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
  return answer.study_analysis(frame, {}, ['platform'], METRIC, source=source)


def test_a_table_without_columns_is_not_written_and_said(tmp_path, capsys):
  out = small_out('x.csv')
  out.pairs = pd.DataFrame()  # declared contrasts only: no pair tested
  files = catalogue.write(
    catalogue.ANALYSE,
    catalogue.Given(result=out),
    str(tmp_path),
    only={'report_pairs.csv', 'report_excluded.csv'},
  )
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
