"""benchmarks/gpu_evidence.py: the GPU agenda at toy size on CPU, its list, its resumability, its
pack; the study's seed slices (benchmarks/study_seeds.py); the replicates' headline."""

import csv
import subprocess
import sys
import tarfile

import pytest

from benchmarks import gpu_evidence, study_seeds
from benchmarks import gpu_evidence_parts as agenda
from configs import digits
from tests.conftest import ROOT

NAMES = [p.name for p in agenda.PARTS]


def evidence(args, env, timeout=1200):
  return subprocess.run([sys.executable, '-m', 'benchmarks.gpu_evidence', *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(1800)  # every benchmark at toy size: 9 min on 2 cores at load 11
def test_smoke_runs_every_part_writes_the_summary_and_skips_done_parts(tmp_path, subprocess_env):
  out = tmp_path / 'evidence'
  first = evidence(['--smoke', '--out', str(out)], subprocess_env)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  with open(out / 'summary.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['part'] for r in rows] == NAMES
  assert {r['status'] for r in rows} == {'completed (smoke)'}, rows
  assert all(r['headline'] and not r['headline'].startswith('no ') for r in rows), rows
  summary = (out / 'summary.md').read_text()
  assert all(f'| {name} |' in summary for name in NAMES)
  again = evidence(['--smoke', '--out', str(out)], subprocess_env, timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  skipped = [l.split(':')[0] for l in again.stdout.splitlines() if 'completed already' in l]
  assert skipped == NAMES


def test_list_names_every_part_with_its_minutes_on_an_h100(capsys):
  assert gpu_evidence.main(['--list']) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert [l.split()[0] for l in lines[:-1]] == NAMES and len(set(NAMES)) == len(NAMES)
  assert all(0 < int(l.split()[1]) < 9 and l.split()[2] == 'min' for l in lines[:-1])
  assert lines[-1] == f'{len(NAMES)} parts, {sum(p.minutes for p in agenda.PARTS)} minutes on ' \
                      'an H100 in all'


def fake_part(name, seconds, fail=False):
  code = f'import time, sys; print("value=1"); time.sleep({seconds}); sys.exit({int(fail)})'
  steps = lambda ctx: [agenda.Step('one', [sys.executable, '-c', 'print("x=2")']),
                       agenda.Step('two', [sys.executable, '-c', code])]
  return agenda.Part(name, 1, 'a test part', steps, agenda.key_values)


def test_a_part_stopped_midway_is_not_done_and_runs_again(tmp_path, monkeypatch, capsys):
  """A failed or timed-out command leaves the part undone (its first command's output does not
  count); the next call runs it from its first command; a completed part is then skipped."""
  parts = [fake_part('slow', 30), fake_part('failing', 0, fail=True)]
  monkeypatch.setattr(agenda, 'PARTS', parts)
  assert gpu_evidence.main(['--part', 'all', '--out', str(tmp_path), '--part-minutes', '0.02']) == 1
  statuses = {r['part']: r['status'] for r in gpu_evidence.summary_rows(str(tmp_path))}
  assert statuses == {'slow': 'timed out', 'failing': 'failed: two exit 1'}
  assert not gpu_evidence.is_done(gpu_evidence.read_status(str(tmp_path), 'slow'), False)
  parts[0] = fake_part('slow', 0)
  assert gpu_evidence.main(['--part', 'slow', '--out', str(tmp_path)]) == 0
  status = gpu_evidence.read_status(str(tmp_path), 'slow')
  assert status['status'] == 'completed' and status['headline'] == 'x=2; value=1'
  assert [c['label'] for c in status['commands']] == ['one', 'two']
  capsys.readouterr()
  assert gpu_evidence.main(['--part', 'slow', '--out', str(tmp_path)]) == 0
  assert 'slow: completed already (skipped' in capsys.readouterr().out
  assert not gpu_evidence.is_done(status, smoke=True)  # a GPU part is not a smoke part


def test_bad_flags_are_one_line(capsys):
  for argv, message in ((['--part', 'gpu_tier,nope', '--out', 'x'], '--part=gpu_tier,nope: give'),
                        (['--part', 'all'], '--out: give the evidence folder'),
                        (['--out', 'x'], '--part: give all or part names')):
    with pytest.raises(SystemExit) as exit_info:
      gpu_evidence.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith('error: ' + message)


def test_pack_keeps_records_and_logs_but_not_training_states(tmp_path):
  run = tmp_path / 'ev' / 'study' / 'runs' / 'arm' / 'seed0'
  for name in ('checkpoints/10/state/d.bin', 'checkpoints/10/results/r.json', 'train.log'):
    (run / name).parent.mkdir(parents=True, exist_ok=True)
    (run / name).write_text('x')
  (tmp_path / 'ev' / 'summary.md').write_text('s')
  gpu_evidence.pack(str(tmp_path / 'ev'), str(tmp_path / 'ev.tar.gz'))
  with tarfile.open(tmp_path / 'ev.tar.gz') as tar:
    files = {n for n in tar.getnames() if '.' in n.rsplit('/', 1)[-1]}
  base = 'ev/study/runs/arm/seed0/'
  assert files == {'ev/summary.md', base + 'checkpoints/10/results/r.json', base + 'train.log'}


def test_study_slices_run_the_studys_arms_over_the_chosen_seeds():
  arms = digits.study_arms(digits.get_config('study').batch_size)
  sweep = study_seeds.get_sweep('study,seeds=16,only=4-7')
  assert sweep == [{**arm, 'seed': s} for arm in arms for s in range(4, 8)]
  assert len(study_seeds.get_sweep('study,seeds=16')) == 16 * len(arms)
  assert study_seeds.get_sweep('smoke,arms=1,seeds=1') == [{**arms[0], 'seed': 0}]
  assert study_seeds.get_study('study,seeds=16,only=0-3') == {**digits.get_study('study'),
                                                             'seeds': 16}
  assert study_seeds.get_config('study,seeds=16,only=4-7,seed=3').to_dict() == \
      digits.get_config('study,seed=3').to_dict()
  for arg, message in (('study,seeds=4,only=2-4', 'only=2-4: give A-B with 0 <= A <= B < seeds=4'),
                       ('study,seeds=0', 'seeds=0: give a positive whole number')):
    with pytest.raises(ValueError, match=message):
      study_seeds.get_sweep(arg)


def test_replicate_headline_counts_identical_states_and_accuracy_gaps(monkeypatch):
  def record(digest, accuracy, status='completed'):
    return {'status': status, 'state_digest': digest, 'final': {'test_accuracy': accuracy}}
  roots = {'a': {'x/seed0': record(1, 0.95), 'x/seed1': record(2, 0.93), 'y/seed0': record(3, 0.9),
                 'z/seed0': record(4, 0.9, 'failed')},
           'b': {'x/seed0': record(1, 0.95), 'x/seed1': record(5, 0.925), 'y/seed0': record(6, 0.9),
                 'z/seed0': record(4, 0.9)}}
  monkeypatch.setattr(agenda, 'records', roots.get)
  assert agenda.replicate_line('a', 'b') == (
      '3 same-seed pairs: bit-identical final states 1, equal test accuracy 2, largest '
      'accuracy difference 0.50 pp')


def test_runs_headline_counts_completed_runs_and_their_accuracy(monkeypatch):
  runs = {'a/seed0': {'status': 'completed', 'seed': 0, 'final': {'test_accuracy': 0.9}},
          'a/seed4': {'status': 'completed', 'seed': 4, 'final': {'test_accuracy': 0.95}},
          'b/seed4': {'status': 'completed', 'seed': 4, 'final': {'test_accuracy': 0.97}},
          'c/seed5': {'status': 'failed', 'seed': 5, 'final': {}}, 'd/seed6': None}
  monkeypatch.setattr(agenda, 'records', lambda root: runs)
  assert agenda.runs_line('r', range(4, 8)) == (
      '2 of 3 runs completed; test accuracy mean 96.00 % (95.00-97.00)')
  assert agenda.runs_line('r').startswith('3 of 4 runs completed; test accuracy mean 94.00 %')
