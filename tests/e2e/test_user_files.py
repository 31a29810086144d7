"""The user's files after each analysis command (issue 41's lost-file cases, each exit 0 before):
planted beside or inside the command's --out, then checked byte for byte (content, mode, link)
once the command has run as a user runs it (`python -m analysis.X`, or main(argv) in process).
Every write goes through runrecord/files.py."""

import json
import os

import pytest

from analysis import analyse, draw, export
from runrecord import files
from tests.support.commands import cli_error, run_module
from tests.support.planted_runs import plant
from tests.support.planted_tables import runs_csv


def state(path):
  """What must not change of a user's file: its bytes, mode, and link target (None: no link)."""
  link = os.readlink(path) if os.path.islink(path) else None
  with open(path, 'rb') as f:
    return f.read(), os.stat(path).st_mode, link


def plant_files(folder, names, mode=0o640):
  folder.mkdir(parents=True, exist_ok=True)
  for name in names:
    (folder / name).write_text(f'{name}: written by hand\n')
    os.chmod(folder / name, mode)
  return {name: state(folder / name) for name in names}


def test_a_folder_holding_the_users_report_is_refused_naming_it_and_nothing_is_written(tmp_path):
  """Case 1. Before: report_notes.csv and attribution_2025.csv were deleted, report.md replaced."""
  out = tmp_path / 'out'
  mine = plant_files(out, ['report.md', 'report_notes.csv', 'attribution_2025.csv'])
  done = run_module(['analysis.analyse', '--csv', runs_csv(tmp_path / 'a.csv'), '--out', str(out)])
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1 and 'report.md' in lines[0], done.stderr
  assert 'report_notes.csv' not in lines[0]  # never written by the analysis: no reason to refuse
  assert sorted(os.listdir(out)) == sorted(mine)
  assert {name: state(out / name) for name in mine} == mine
  (out / 'report.md').unlink()  # the user moves it away: the others are left alone
  del mine['report.md']
  done = run_module(['analysis.analyse', '--csv', runs_csv(tmp_path / 'a.csv'), '--out', str(out)])
  assert done.returncode == 0 and (out / 'report.md').exists(), done.stderr[-2000:]
  assert {name: state(out / name) for name in mine} == mine


@pytest.mark.parametrize('manifest', [files.MANIFEST, '.analysis-files.json'])
def test_a_manifest_naming_a_file_outside_the_folder_touches_nothing_there(tmp_path, manifest):
  """Case 2. Before: a manifest naming ../victim.txt deleted the file outside --out."""
  out = tmp_path / 'out'
  victim = plant_files(tmp_path, ['victim.txt'], mode=0o600)
  out.mkdir()
  entry = {'sha256': files.sha256(tmp_path / 'victim.txt'), 'by': analyse.COMMAND}
  planted = {'../victim.txt': entry} if manifest == files.MANIFEST else {'files': ['../victim.txt']}
  (out / manifest).write_text(json.dumps(planted))
  for shift in (0.0, 0.05):  # the second run has stale files of the first to remove
    analyse.main(['--csv', runs_csv(tmp_path / f'{shift}.csv', shift), '--out', str(out)])
  assert state(tmp_path / 'victim.txt') == victim['victim.txt']


def test_draw_analyse_and_attribute_share_one_out(tmp_path, capsys):
  """Case 3. Before: analysis.draw into a folder analysis.analyse wrote deleted report.md,
  report.tex and every report CSV."""
  runs, out = plant(tmp_path / 'root'), tmp_path / 'out'
  analyse.main(['--runs', runs, '--out', str(out)])
  report = {
    os.path.relpath(os.path.join(d, n), out): state(os.path.join(d, n))
    for d, _, names in os.walk(out)
    for n in names
    if not n.startswith('.')
  }
  assert 'report.md' in report and 'report.tex' in report and 'report_arms.csv' in report
  done = run_module(['analysis.draw', '--runs', runs, '--out', str(out)])
  assert done.returncode == 0, done.stderr[-2000:]
  assert {name: state(out / name) for name in report} == report
  drawn = {n: state(out / n) for n in os.listdir(out) if n.endswith('.png')}
  assert 'accuracy_by_arm.png' in drawn
  analyse.main(['--runs', runs, '--out', str(out)])  # again: draw's files are not its own
  assert {n: state(out / n) for n in drawn} == drawn
  capsys.readouterr()


def readme(path, text, mode=0o600):
  path.write_text(text, encoding='utf-8')
  os.chmod(path, mode)
  return path


def test_export_to_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
  """Case 5. Before: `--out link.csv` replaced the link by a regular file."""
  runs = plant(tmp_path / 'root')
  target = tmp_path / 'data' / 'runs.csv'
  before = plant_files(tmp_path / 'data', ['runs.csv'], mode=0o600)['runs.csv']
  os.symlink(target, tmp_path / 'link.csv')
  done = run_module(['analysis.export', '--runs', runs, '--out', str(tmp_path / 'link.csv')])
  assert done.returncode == 0, done.stderr[-2000:]
  assert os.readlink(tmp_path / 'link.csv') == str(target)
  content, mode, _ = state(target)
  assert content != before[0] and content.startswith(b'run,') and mode == before[1]


def test_an_export_rewrites_or_removes_its_own_declaration_never_a_users(tmp_path, capsys):
  """Case 6. Before: re-exporting without --study left the old FILE.study.json, which
  `--csv X --study X.study.json` then read."""
  runs, csv = plant(tmp_path / 'root'), tmp_path / 'runs.csv'
  study = tmp_path / 'declared.json'
  study.write_text('{"margin": 1.0}')
  export.main(['--runs', runs, '--out', str(csv), '--study', str(study)])
  assert (tmp_path / 'runs.study.json').exists()
  export.main(['--runs', runs, '--out', str(csv)])  # no declaration now: its own one removed
  assert not (tmp_path / 'runs.study.json').exists()
  mine = plant_files(tmp_path, ['runs.study.json'])  # a user's own
  export.main(['--runs', runs, '--out', str(csv)])
  lines = cli_error(capsys, export.main, ['--runs', runs, '--out', str(csv), '--study', str(study)])
  assert len(lines) == 1 and 'runs.study.json' in lines[0]
  assert state(tmp_path / 'runs.study.json') == mine['runs.study.json']


def test_draw_refuses_a_users_figure_in_the_way(tmp_path, capsys):
  runs, out = plant(tmp_path / 'root'), tmp_path / 'out'
  mine = plant_files(out, ['contrasts.png', 'notes.txt'])
  lines = cli_error(capsys, draw.main, ['--runs', runs, '--out', str(out)])
  assert len(lines) == 1 and 'contrasts.png' in lines[0] and 'notes.txt' not in lines[0]
  assert {name: state(out / name) for name in mine} == mine and sorted(os.listdir(out)) == sorted(
    mine
  )
