"""benchmarks/gpu_evidence.py: the GPU agenda at toy size on CPU, its list, its resumability, its
pack; the study's seed slices (its get_sweep); the replicates' headline."""

import csv
import shlex
import subprocess
import sys
import tarfile

import pytest

from benchmarks import gpu_evidence
from configs import digits
from tests.conftest import ROOT

NAMES = [p.name for p in gpu_evidence.PARTS]


def evidence(args, env, timeout=1200):
  return subprocess.run(
    [sys.executable, '-m', 'benchmarks.gpu_evidence', *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def plan_commands(stdout):
  """The commands a --budget plan prints (the lines under each call), as argv lists."""
  return [
    shlex.split(line.strip())[3:]
    for line in stdout.splitlines()
    if line.startswith('  python -m benchmarks.gpu_evidence ')
  ]


def done_parts(out):
  return [
    p.name
    for p in gpu_evidence.PARTS
    if gpu_evidence.is_done(gpu_evidence.read_status(str(out), p.name), smoke=True)
  ]


@pytest.mark.timeout(1800)  # every benchmark at toy size: 9 min on 2 cores at load 11
def test_smoke_runs_the_budget_plan_then_every_part_writes_the_summary_and_skips_done_parts(
  tmp_path, subprocess_env
):
  """The 15-minute plan's commands, run at toy size on CPU, complete exactly the planned parts in
  the planned order; planned again, the slot holds what the first plan left for the next one, in
  its order; then every other part, the summary, and a second call that skips them all."""
  out = tmp_path / 'evidence'
  plan = evidence(['--budget', '15', '--smoke', '--out', str(out)], subprocess_env, timeout=120)
  assert plan.returncode == 0 and not out.exists(), plan.stderr[-2000:]  # a plan writes nothing
  commands = plan_commands(plan.stdout)
  planned = [c[c.index('--part') + 1].split(',') for c in commands]
  assert planned == [['determinism_2048', 'vs_torch_2048'], ['study_seeds_0_1']]
  later = plan.stdout.split('next slot (')[1].split('): ')[1].split(', ')
  for command, parts in zip(commands, planned, strict=True):
    ran = evidence(command, subprocess_env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert [line.split(':')[0] for line in ran.stdout.splitlines() if ': running' in line] == parts
  assert done_parts(out) == sorted(sum(planned, []), key=NAMES.index)
  again = evidence(['--budget', '15', '--smoke', '--out', str(out)], subprocess_env, timeout=120)
  replanned = [p for c in plan_commands(again.stdout) for p in c[c.index('--part') + 1].split(',')]
  assert replanned and replanned == [p.split(' (')[0] for p in later][: len(replanned)]
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
  skipped = [
    line.split(':')[0] for line in again.stdout.splitlines() if 'completed already' in line
  ]
  assert sorted(skipped) == sorted(NAMES)


def test_list_names_every_part_with_its_minutes_on_an_h100(capsys):
  assert gpu_evidence.main(['--list']) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert [line.split()[0] for line in lines[:-1]] == NAMES and len(set(NAMES)) == len(NAMES)
  assert all(0 < float(line.split()[1]) < 9 and line.split()[2] == 'min' for line in lines[:-1])
  assert (
    lines[-1] == f'{len(NAMES)} parts, {sum(p.minutes for p in gpu_evidence.PARTS):g} minutes on '
    'an H100 in all'
  )


def fake_part(name, seconds, fail=False):
  code = f'import time, sys; print("value=1"); time.sleep({seconds}); sys.exit({int(fail)})'

  def steps(ctx):
    return [
      gpu_evidence.Step('one', [sys.executable, '-c', 'print("x=2")']),
      gpu_evidence.Step('two', [sys.executable, '-c', code]),
    ]

  return gpu_evidence.Part(name, 1, 'a test part', steps, gpu_evidence.key_values)


def test_a_part_stopped_midway_is_not_done_and_runs_again(tmp_path, monkeypatch, capsys):
  """A failed or timed-out command leaves the part undone (its first command's output does not
  count); the next call runs it from its first command; a completed part is then skipped."""
  parts = [fake_part('slow', 30), fake_part('failing', 0, fail=True)]
  monkeypatch.setattr(gpu_evidence, 'PARTS', parts)
  assert gpu_evidence.main(['--part', 'all', '--out', str(tmp_path), '--part-minutes', '0.02']) == 1
  statuses = {r['part']: r['status'] for r in gpu_evidence.summary_rows(str(tmp_path))}
  assert statuses == {'slow': 'timed out', 'failing': 'failed: two: exit 1'}
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
  for argv, message in (
    (['--part', 'gpu_tier,nope', '--out', 'x'], '--part=gpu_tier,nope: give'),
    (['--part', 'all'], '--out: give the evidence folder'),
    (['--out', 'x'], '--part: give all or part names'),
  ):
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
  sweep = gpu_evidence.get_sweep('study,seeds=16,only=4-7')
  assert sweep == [{**arm, 'seed': s} for arm in arms for s in range(4, 8)]
  assert len(gpu_evidence.get_sweep('study,seeds=16')) == 16 * len(arms)
  assert gpu_evidence.get_sweep('smoke,arms=1,seeds=1') == [{**arms[0], 'seed': 0}]
  assert gpu_evidence.get_study('study,seeds=16,only=0-3') == {
    **digits.get_study('study'),
    'seeds': 16,
  }
  assert (
    gpu_evidence.get_config('study,seeds=16,only=4-7,seed=3').to_dict()
    == digits.get_config('study,seed=3').to_dict()
  )
  for arg, message in (
    ('study,seeds=4,only=2-4', 'only=2-4: give A-B with 0 <= A <= B < seeds=4'),
    ('study,seeds=0', 'seeds=0: give a positive whole number'),
  ):
    with pytest.raises(ValueError, match=message):
      gpu_evidence.get_sweep(arg)


def test_replicate_headline_counts_identical_states_and_accuracy_gaps(monkeypatch):
  def record(digest, accuracy, status='completed'):
    return {'status': status, 'state_digest': digest, 'final': {'test_accuracy': accuracy}}

  roots = {
    'a': {
      'x/seed0': record(1, 0.95),
      'x/seed1': record(2, 0.93),
      'y/seed0': record(3, 0.9),
      'z/seed0': record(4, 0.9, 'failed'),
    },
    'b': {
      'x/seed0': record(1, 0.95),
      'x/seed1': record(5, 0.925),
      'y/seed0': record(6, 0.9),
      'z/seed0': record(4, 0.9),
    },
  }
  monkeypatch.setattr(gpu_evidence, 'records', roots.get)
  assert gpu_evidence.replicate_line('a', 'b') == (
    '3 same-seed pairs: bit-identical final states 1, equal test accuracy 2, largest '
    'accuracy difference 0.50 pp'
  )


def test_runs_headline_counts_completed_runs_and_their_accuracy(monkeypatch):
  runs = {
    'a/seed0': {'status': 'completed', 'seed': 0, 'final': {'test_accuracy': 0.9}},
    'a/seed4': {'status': 'completed', 'seed': 4, 'final': {'test_accuracy': 0.95}},
    'b/seed4': {'status': 'completed', 'seed': 4, 'final': {'test_accuracy': 0.97}},
    'c/seed5': {'status': 'failed', 'seed': 5, 'final': {}},
    'd/seed6': None,
  }
  monkeypatch.setattr(gpu_evidence, 'records', lambda root: runs)
  assert gpu_evidence.runs_line('r', range(4, 8)) == (
    '2 of 3 runs completed; test accuracy mean 96.00 % (95.00-97.00)'
  )
  assert gpu_evidence.runs_line('r').startswith('3 of 4 runs completed; test accuracy mean 94.00 %')


def test_a_missing_tool_fails_the_part_naming_it_and_a_resume_runs_it_again(
  tmp_path, monkeypatch, capsys
):
  """gpu_tier where `python -m pytest` finds no pytest (exit 1, which pytest also uses for failed
  tests): the part fails naming the module instead of `completed ... no pytest summary`; the next
  call, pytest present, runs it again and completes it. A GPU run whose tests were all skipped
  (no GPU found) is not done either."""
  fake = tmp_path / 'python'
  fake.write_text('#!/bin/bash\necho "$0: No module named pytest" >&2\nexit 1\n')
  fake.chmod(0o755)
  monkeypatch.setattr(gpu_evidence, 'PY', str(fake))
  assert gpu_evidence.main(['--part', 'gpu_tier', '--out', str(tmp_path / 'ev')]) == 1
  status = gpu_evidence.read_status(str(tmp_path / 'ev'), 'gpu_tier')
  assert status['status'] == (
    'failed: pytest: no pytest summary line; missing module pytest (No module named pytest)'
  ), status
  assert not gpu_evidence.is_done(status, smoke=False)
  fake.write_text('#!/bin/bash\necho "3 skipped in 0.1s"\n')
  assert gpu_evidence.main(['--part', 'gpu_tier', '--out', str(tmp_path / 'ev')]) == 1
  status = gpu_evidence.read_status(str(tmp_path / 'ev'), 'gpu_tier')
  assert status['status'] == 'failed: pytest: no GPU test ran (3 skipped in 0.1s)', status
  fake.write_text('#!/bin/bash\necho "===== 2 passed, 1 failed in 3.2s ====="\nexit 1\n')
  capsys.readouterr()
  assert gpu_evidence.main(['--part', 'gpu_tier', '--out', str(tmp_path / 'ev')]) == 0
  status = gpu_evidence.read_status(str(tmp_path / 'ev'), 'gpu_tier')
  assert status['status'] == 'completed' and status['headline'] == '2 passed, 1 failed in 3.2s'


def test_a_benchmark_without_its_result_line_is_not_done(tmp_path, monkeypatch):
  """Exit 0 is not enough: a benchmark that printed no `<key>=<number>` line failed."""

  def steps(ctx):
    return [
      gpu_evidence.Step(
        'bench_pool',
        [sys.executable, '-c', 'print("table only")'],
        expect=gpu_evidence.result_line('pool_speedup'),
      )
    ]

  monkeypatch.setattr(
    gpu_evidence, 'PARTS', [gpu_evidence.Part('pool', 1, 'x', steps, gpu_evidence.key_values)]
  )
  assert gpu_evidence.main(['--part', 'pool', '--out', str(tmp_path)]) == 1
  assert gpu_evidence.read_status(str(tmp_path), 'pool')['status'] == (
    'failed: bench_pool: no pool_speedup=<number> result line'
  )


def planted(*minutes):
  return [gpu_evidence.Part(f'p{i}', m, 'x', None, None) for i, m in enumerate(minutes)]


def test_the_plan_fills_calls_in_priority_order_within_the_budget_and_the_call_limit():
  """By hand: start-up 3, overhead 0.5 a call, calls of at most 9, budget 12. p0 (5) opens call 1
  (5.5; total 8.5); p1 (5) fits neither call 1 (10.5 > 9) nor a new call (14 > 12): next slot;
  p2 (2) joins call 1 (7.5; total 10.5); p3 (9) is longer than any call; p4 (1) joins call 1
  (8.5; total 11.5). Priority p4 first instead: it opens call 1 and p0 joins it."""
  parts = planted(5, 5, 2, 9, 1)
  plan = gpu_evidence.make_plan(
    parts, ['p0', 'p1', 'p2', 'p3', 'p4'], 12, startup=3, limit=9, overhead=0.5
  )
  assert [[p.name for p in c.parts] for c in plan.calls] == [['p0', 'p2', 'p4']]
  assert [c.minutes for c in plan.calls] == [8.5] and plan.total == 11.5
  assert [p.name for p in plan.later] == ['p1'] and [p.name for p in plan.too_long] == ['p3']
  plan = gpu_evidence.make_plan(
    parts, ['p4', 'p0', 'p1', 'p2', 'p3'], 12, done={'p2'}, startup=3, limit=9, overhead=0.5
  )
  assert [[p.name for p in c.parts] for c in plan.calls] == [['p4', 'p0']]
  assert [p.name for p in plan.later] == ['p1'] and plan.total == 9.5


def test_the_15_minute_plan_puts_the_headline_figures_first_and_lists_the_rest(capsys):
  """The study's batch first (determinism, then torch.compile), then a study slice with its
  predictions; every call within 9 minutes, the slot within 15 with its start-up; each part
  planned once or left for the next slot; with those done, the next plan starts where it left."""
  assert sorted(gpu_evidence.PRIORITY) == sorted(NAMES)
  plan = gpu_evidence.make_plan(gpu_evidence.PARTS, gpu_evidence.PRIORITY, 15)
  calls = [[p.name for p in c.parts] for c in plan.calls]
  assert calls == [['determinism_2048', 'vs_torch_2048'], ['study_seeds_0_1']]
  assert all(c.minutes <= gpu_evidence.CALL_MINUTES for c in plan.calls)
  assert plan.total == gpu_evidence.STARTUP_MINUTES + sum(c.minutes for c in plan.calls) <= 15
  later = [p.name for p in plan.later]
  assert sorted(sum(calls, []) + later) == sorted(NAMES) and not plan.too_long
  assert later == [n for n in gpu_evidence.PRIORITY if n not in sum(calls, [])]
  following = gpu_evidence.make_plan(
    gpu_evidence.PARTS, gpu_evidence.PRIORITY, 15, done=set(sum(calls, []))
  )
  assert [p.name for c in following.calls for p in c.parts] == later[
    : len([p for c in following.calls for p in c.parts])
  ]
  assert gpu_evidence.main(['--budget', '15']) == 0
  printed = capsys.readouterr().out
  assert 'call 1 (9 min): determinism_2048 (5), vs_torch_2048 (3.5)' in printed
  assert (
    '--part determinism_2048,vs_torch_2048 --out runs/gpu_evidence --call-minutes 8.5' in printed
  )
  assert 'planned: 14.5 of 15 min (2 call(s), 3 part(s))' in printed
  assert f'next slot ({len(later)} part(s)' in printed


def test_call_minutes_starts_only_the_parts_that_end_within_the_call(tmp_path, monkeypatch, capsys):
  parts = [fake_part('first', 0), fake_part('second', 0)]
  parts[1] = parts[1]._replace(minutes=8.6)  # 0 min elapsed + 8.6 > 8.5
  monkeypatch.setattr(gpu_evidence, 'PARTS', parts)
  assert (
    gpu_evidence.main(['--part', 'first,second', '--out', str(tmp_path), '--call-minutes', '8.5'])
    == 1
  )
  printed = capsys.readouterr().out
  assert 'first: completed' in printed and 'second: running' not in printed
  assert 'not started (past --call-minutes 8.5): second' in printed
  assert gpu_evidence.read_status(str(tmp_path), 'second') is None


def test_the_users_files_in_the_evidence_folder_are_refused_or_left_alone(tmp_path, monkeypatch):
  """A file of the user's where the program would write (a part's output, the summary) is refused
  before any part runs, byte for byte unchanged; a file beside the outputs stays as it was."""
  monkeypatch.setattr(gpu_evidence, 'PARTS', [fake_part('p', 0)])
  out = tmp_path / 'ev'
  (out / 'p').mkdir(parents=True)
  for name, mode in (('p/two.txt', 0o600), ('summary.md', 0o644), ('notes.txt', 0o640)):
    (out / name).write_text(f'mine: {name}\n')
    (out / name).chmod(mode)
  before = {p: (p.read_bytes(), p.stat().st_mode) for p in out.rglob('*') if p.is_file()}
  with pytest.raises(SystemExit) as exit_info:
    gpu_evidence.main(['--part', 'p', '--out', str(out)])
  assert exit_info.value.code == 2
  assert {p: (p.read_bytes(), p.stat().st_mode) for p in out.rglob('*') if p.is_file()} == before
  (out / 'p' / 'two.txt').unlink()
  (out / 'summary.md').unlink()
  assert gpu_evidence.main(['--part', 'p', '--out', str(out)]) == 0
  assert (out / 'notes.txt').read_bytes() == b'mine: notes.txt\n'
  assert (out / 'p' / 'two.txt').read_text() == 'value=1\n' and (out / 'summary.md').exists()
  assert gpu_evidence.main(['--part', 'p', '--out', str(out), '--force']) == 0  # its own: rewritten
