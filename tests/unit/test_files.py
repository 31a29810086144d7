"""runrecord/files.py: no write touches a file this project did not write. Each case plants a
user's files and checks them byte for byte (content, mode, symlink) after the command."""

import json
import os

import pytest

from runrecord import files

ANALYSE = ['report*', 'attribution*', 'figures/*']


def plant(path, text, mode=0o644):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  os.chmod(path, mode)


def snapshot(folder):
  """{name: (content, mode, link target or None)} of everything under `folder`."""
  out = {}
  for root, dirs, names in os.walk(folder):
    for n in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
      p = os.path.join(root, n)
      link = os.readlink(p) if os.path.islink(p) else None
      body = open(p, 'rb').read() if os.path.isfile(p) else None
      out[os.path.relpath(p, folder)] = (body, os.lstat(p).st_mode, link)
  return out


def write(folder, command, texts, may_write=ANALYSE):
  def stage(staging):
    paths = []
    for name, text in texts.items():
      plant(os.path.join(staging, name), text)
      paths.append(os.path.join(staging, name))
    return paths

  with files.Destination(folder, command=command, may_write=may_write) as dest:
    return dest.write(stage)


def test_a_folder_holding_the_users_own_report_is_refused_and_left_whole(tmp_path):
  out = tmp_path / 'out'
  plant(str(out / 'report.md'), 'my own notes\n', 0o600)
  plant(str(out / 'report_notes.csv'), 'a,b\n')
  plant(str(out / 'attribution_2025.csv'), 'x\n')
  plant(str(out / 'unrelated.txt'), 'keep\n')
  before = snapshot(out)
  with pytest.raises(ValueError, match='attribution_2025.csv, report.md, report_notes.csv'):
    write(out, 'analyse', {'report.md': 'new\n'})
  assert snapshot(out) == before


def test_files_beside_the_outputs_are_left_alone(tmp_path):
  out = tmp_path / 'out'
  plant(str(out / 'notes.txt'), 'keep\n', 0o600)
  before = snapshot(out)
  write(out, 'analyse', {'report.md': 'one\n', 'report_arms.csv': 'a\n'})
  write(out, 'analyse', {'report.md': 'two\n'})  # report_arms.csv: this command's, now stale
  after = snapshot(out)
  assert after['notes.txt'] == before['notes.txt']
  assert not (out / 'report_arms.csv').exists() and (out / 'report.md').read_text() == 'two\n'


def test_a_manifest_naming_a_file_outside_the_folder_deletes_nothing_there(tmp_path):
  out = tmp_path / 'out'
  plant(str(tmp_path / 'victim.txt'), 'precious\n')
  write(out, 'analyse', {'report.md': 'one\n'})
  digest = files.sha256(str(tmp_path / 'victim.txt'))
  manifest = json.loads((out / files.MANIFEST).read_text())
  manifest['../victim.txt'] = manifest['/etc/hostname'] = {'sha256': digest, 'by': 'analyse'}
  (out / files.MANIFEST).write_text(json.dumps(manifest))
  write(out, 'analyse', {'report.md': 'two\n'})
  assert (tmp_path / 'victim.txt').read_text() == 'precious\n'


def test_two_commands_share_one_folder_each_removing_only_its_own_files(tmp_path):
  out = tmp_path / 'out'
  write(out, 'analyse', {'report.md': 'r\n', 'report.tex': 't\n', 'figures/a.png': 'A'})
  write(out, 'draw', {'figures/a.png': 'A2', 'figures/b.png': 'B'})
  assert {p.name for p in out.rglob('*') if p.is_file()} >= {'report.md', 'report.tex', 'b.png'}
  write(out, 'draw', {'figures/b.png': 'B2'})  # a.png is draw's now: removed; the report stays
  assert not (out / 'figures' / 'a.png').exists()
  assert (out / 'report.md').read_text() == 'r\n' and (out / 'report.tex').read_text() == 't\n'


def test_an_edited_output_is_the_users_and_refused(tmp_path):
  out = tmp_path / 'out'
  write(out, 'analyse', {'report.md': 'r\n'})
  (out / 'report.md').write_text('r\nmy edits\n')
  before = snapshot(out)
  with pytest.raises(ValueError, match='report.md'):
    write(out, 'analyse', {'report.md': 'again\n'})
  assert snapshot(out) == before


def test_a_symlink_where_an_output_goes_is_refused(tmp_path):
  out = tmp_path / 'out'
  plant(str(tmp_path / 'elsewhere.md'), 'mine\n')
  out.mkdir()
  os.symlink(tmp_path / 'elsewhere.md', out / 'report.md')
  before, mine = snapshot(out), snapshot(tmp_path)['elsewhere.md']
  with pytest.raises(ValueError, match='report.md'):
    write(out, 'analyse', {'report.md': 'x\n'})
  assert snapshot(out) == before and snapshot(tmp_path)['elsewhere.md'] == mine


def test_a_symlinked_file_target_is_followed_and_keeps_its_mode(tmp_path):
  real = tmp_path / 'real' / 'runs.csv'
  plant(str(real), 'old\n', 0o600)
  link = tmp_path / 'link.csv'
  os.symlink(real, link)
  path = files.write_file(str(link), 'new\n', command='export')
  assert os.path.islink(link) and os.readlink(link) == str(real)
  assert real.read_text() == 'new\n' and oct(real.stat().st_mode & 0o777) == '0o600'
  assert path == str(real) and not (tmp_path / files.MANIFEST).exists()


def test_a_companion_is_rewritten_or_removed_only_when_the_project_wrote_it(tmp_path):
  csv, study = tmp_path / 'x.csv', 'x.study.json'

  def export(with_study):
    texts = {'x.csv': 'a\n', **({study: '{}'} if with_study else {})}

    def stage(staging):
      for name, text in texts.items():
        plant(os.path.join(staging, name), text)
      return [os.path.join(staging, n) for n in texts]

    with files.Destination(
      csv,
      command='export',
      folder=False,
      may_write=[study] if with_study else [],
      companions=[study],
    ) as dest:
      return dest.write(stage)

  export(True)
  assert (tmp_path / study).exists()
  export(False)  # the declaration it wrote is stale: removed
  assert not (tmp_path / study).exists()
  plant(str(tmp_path / study), '{"mine": 1}')
  export(False)  # the user's own: left alone
  assert (tmp_path / study).read_text() == '{"mine": 1}'
  with pytest.raises(ValueError, match=study):
    export(True)  # and never overwritten
  assert (tmp_path / study).read_text() == '{"mine": 1}'


def test_a_folder_that_is_a_file_and_a_file_that_is_a_folder_are_one_line(tmp_path):
  (tmp_path / 'f').write_text('x')
  with pytest.raises(ValueError, match='is a file'):
    files.Destination(tmp_path / 'f', command='analyse')
  with pytest.raises(ValueError, match='is a folder'):
    files.Destination(tmp_path, command='export', folder=False)
