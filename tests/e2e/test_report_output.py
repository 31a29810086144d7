"""Reports written atomically and exclusively (issue 36, cases 3 and 14): every writer of the
analysis stages its files beside --out and moves them into place when all are written, under a
lock; a second command on the same --out is refused in one line; a failed write (an injected
ENOSPC, and a real full tmpfs) leaves the previous report whole and says so."""

import errno
import hashlib
import os
import sys

import pandas as pd
import pytest

from analysis import analyse, attribute, draw, export
from runrecord import files, record
from tests.support.commands import cli_error, in_mount_namespace
from tests.support.planted_runs import plant
from tests.support.planted_tables import runs_csv

METRIC = record.DEFAULT_METRIC


def tree(folder):
  """{relative path: sha256} of every file under `folder`."""
  out = {}
  for here, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(here, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture
def report(tmp_path, capsys):
  """An --out folder holding a complete report, and the CSV it came from."""
  csv = runs_csv(tmp_path / 'a.csv')
  analyse.main(['--csv', csv, '--out', str(tmp_path / 'out')])
  capsys.readouterr()
  return tmp_path / 'out', csv


def test_a_second_analysis_on_the_same_out_is_refused_in_one_line(report, tmp_path, capsys):
  """Case 3. Before: two analyses on one --out both exited 0 and left report.md from one and the
  CSVs of the other."""
  out, _ = report
  before = tree(out)
  with files.Destination(out, command='analysis.analyse'):  # the first analysis, still writing
    lines = cli_error(
      capsys, analyse.main, ['--csv', runs_csv(tmp_path / 'b.csv', 0.05), '--out', str(out)]
    )
    assert len(lines) == 1 and lines[0].startswith(
      f'error: --out {out}: another command is writing it (pid {os.getpid()} on '
    )
    assert lines[0].endswith('wait for it, or give another --out')
  assert tree(out) == before  # untouched: the first analysis's lock file is gone again too


def test_a_failed_write_leaves_the_previous_report_whole_and_says_so(
  report, tmp_path, capsys, monkeypatch
):
  """Case 14. Before: an OSError traceback, a 0-byte report_arms.csv and the rest missing: files
  were written in place, so a failed rerun destroyed the previous report file by file."""
  out, _ = report
  before = tree(out)
  calls, to_csv = [], pd.DataFrame.to_csv

  def disk_full(self, path=None, *args, **kwargs):
    calls.append(path)
    if len(calls) == 3:
      with open(path, 'w') as f:
        f.write('')  # the file is opened, then the disk is full
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return to_csv(self, path, *args, **kwargs)

  monkeypatch.setattr(pd.DataFrame, 'to_csv', disk_full)
  with pytest.raises(SystemExit) as e:
    analyse.main(['--csv', runs_csv(tmp_path / 'b.csv', 0.05), '--out', str(out)])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 1 and 'Traceback' not in '\n'.join(err)
  assert err[-1].startswith(
    f'error: --out {out}: could not write (No space left on device ('
  ) and err[-1].endswith(
    'nothing was moved into place and what was there is unchanged; free space or fix the '
    'folder, then run again'
  )
  assert tree(out) == before  # every file whole, no staging folder or lock left


def test_a_later_report_leaves_no_file_of_the_earlier_one(report, capsys):
  """A report is one analysis: report_pairs.csv of an --all-pairs run does not outlive it."""
  out, csv = report
  analyse.main(['--csv', csv, '--out', str(out), '--all-pairs'])
  assert (out / 'report_pairs.csv').exists()
  (out / 'notes.txt').write_text('mine')  # not the analysis's: kept
  analyse.main(['--csv', csv, '--out', str(out), '--study', write_study(out.parent)])
  capsys.readouterr()
  assert not (out / 'report_pairs.csv').exists() and (out / 'notes.txt').read_text() == 'mine'
  assert files.MANIFEST in os.listdir(out)


def write_study(folder):
  path = folder / 'study.json'
  path.write_text(
    '{"factors": ["platform", "compute_dtype"], "reference": {"compute_dtype": '
    '"float32"}, "margin": 1.0}'
  )
  return str(path)


def test_bad_input_writes_nothing_not_even_the_lock(tmp_path, capsys, report):
  out, _ = report
  before = tree(out)
  bad = tmp_path / 'bad.csv'
  bad.write_text('run,platform,final.test_accuracy\nr0,cpu,abc\n')
  cli_error(capsys, analyse.main, ['--csv', str(bad), '--out', str(out)])
  cli_error(capsys, analyse.main, ['--csv', str(bad), '--out', str(tmp_path / 'new' / 'out')])
  assert tree(out) == before and not (tmp_path / 'new').exists()


@pytest.mark.parametrize('command', ['attribute', 'export', 'draw'])
def test_every_writer_is_refused_while_its_destination_is_held_and_fails_whole(
  command, tmp_path, capsys, monkeypatch
):
  csv = runs_csv(tmp_path / 'a.csv')
  target = {
    'attribute': tmp_path / 'out',
    'export': tmp_path / 'runs.csv',
    'draw': tmp_path / 'figures',
  }[command]
  runs = plant(tmp_path / 'root') if command in ('export', 'draw') else None
  argv = {
    'attribute': ['--csv', csv, '--factors', 'platform', 'compute_dtype', '--out', str(target)],
    'export': ['--runs', str(runs), '--out', str(target)],
    'draw': ['--runs', str(runs), '--out', str(target)],
  }[command]
  main = {'attribute': attribute.main, 'export': export.main, 'draw': draw.main}[command]
  main(argv)
  capsys.readouterr()
  folder = command in ('attribute', 'draw')
  before = tree(target if folder else tmp_path)
  with files.Destination(target, command='analysis.other', folder=folder):
    lines = cli_error(capsys, main, argv)
    assert len(lines) == 1 and 'another command is writing it' in lines[0]
  replace = os.replace

  def disk_full(src, dst):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)

  monkeypatch.setattr(os, 'replace', disk_full)
  with pytest.raises(SystemExit) as e:
    main(argv)
  monkeypatch.setattr(os, 'replace', replace)
  assert e.value.code == 1 and 'No space left on device' in capsys.readouterr().err
  assert tree(target if folder else tmp_path) == before


def test_disk_full_on_a_small_tmpfs_leaves_the_previous_report(tmp_path):
  """A real full disk: a tmpfs with room for one report and a half. The second analysis of other
  numbers runs out of space while staging; the first report stays byte for byte."""
  a, b = runs_csv(tmp_path / 'a.csv'), runs_csv(tmp_path / 'b.csv', 0.05)
  analyse.main(['--csv', a, '--out', str(tmp_path / 'probe')])
  size = sum(
    os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / 'probe') for f in fs
  )
  disk = tmp_path / 'disk'
  disk.mkdir()
  py = f'{sys.executable} -m analysis.analyse'
  script = (
    f'mount -t tmpfs -o size={int(size * 1.5) // 1024 + 1}k tmpfs {disk} && '
    f'{py} --csv {a} --out {disk}/out > /dev/null 2>&1 && cp -r {disk}/out {tmp_path}/first'
    f' && {py} --csv {b} --out {disk}/out > /dev/null 2> {tmp_path}/err; '
    f'echo $? > {tmp_path}/rc; cp -r {disk}/out {tmp_path}/after'
  )
  done = in_mount_namespace(script, 'a tmpfs cannot be mounted')
  assert done.returncode == 0, done.stderr[-3000:]
  err = (tmp_path / 'err').read_text()
  assert (tmp_path / 'rc').read_text().strip() == '1' and 'Traceback' not in err, err[-3000:]
  assert 'No space left on device' in err.splitlines()[-1]
  assert tree(tmp_path / 'after') == tree(tmp_path / 'first')
