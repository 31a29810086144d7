"""Graceful stop (trainer/stop.py): SIGTERM/SIGINT finish the step, save it, exit 128 + signal.

The signals are real: trainer/faults.py sends them to the process at a chosen step (or inside the
checkpoint write), the multi-process test sends one from outside to one process of two.
"""

import json
import signal
import subprocess
import time

import pytest

from tests.faults_common import (EVERY, SMOKE_ARGS, TRAIN, last_line, metric_records, run_train,
                                 saved_steps, smoke_config, without_wall_time)
from tests.conftest import ROOT
from tests.test_multihost import free_port
from trainer import loop, record


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('stop') / 'reference'
  return workdir, loop.train_and_evaluate(smoke_config(), str(workdir))


def _stopped_line(name, step):
  return (f'stopped: {name} received: stopped after step {step}, whose checkpoint is saved; run '
          'the same command again to resume')


@pytest.mark.timeout(600)
def test_sigterm_saves_the_step_and_the_resumed_run_is_bit_identical(reference, tmp_path,
                                                                     subprocess_env):
  """SIGTERM during step 13 (not a checkpoint step: 4, 8, 12, ...): step 13 is finished and saved,
  exit 143 with one line; the same command ends bit-identical to the uninterrupted run."""
  ref_dir, ref = reference
  workdir = tmp_path / 'w'
  args = SMOKE_ARGS + [f'--workdir={workdir}']
  proc = run_train(args, subprocess_env, fault='term@step:13')
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  last, only_logs = last_line(proc.stderr)
  assert last == _stopped_line('SIGTERM', 13) and only_logs, proc.stderr[-3000:]
  assert 13 in saved_steps(workdir)  # no completed step lost
  saved = record.read_results(str(workdir))
  assert saved['status'] == 'running' and saved['step'] == 13
  assert [r['step'] for r in metric_records(workdir)] == [5, 10]
  proc = run_train(args, subprocess_env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'at step 13' in proc.stderr
  assert without_wall_time(record.read_results(str(workdir))) == without_wall_time(ref)
  assert metric_records(workdir) == metric_records(ref_dir)


@pytest.mark.timeout(600)
def test_second_sigint_exits_at_once_and_the_run_still_resumes(reference, tmp_path,
                                                              subprocess_env):
  """SIGINT at step 13, then SIGINT again while step 13's checkpoint is being written: the process
  ends at once (killed by the signal, no traceback); step 12, written before, resumes the run."""
  ref_dir, ref = reference
  workdir = tmp_path / 'w'
  args = SMOKE_ARGS + [f'--workdir={workdir}']
  proc = run_train(args, subprocess_env, fault='int@step:13,int@save:13')
  assert proc.returncode == -signal.SIGINT, proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr and 'KeyboardInterrupt' not in proc.stderr
  assert 12 in saved_steps(workdir)
  proc = run_train(args, subprocess_env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'at step 12' in proc.stderr or 'at step 13' in proc.stderr
  assert without_wall_time(record.read_results(str(workdir))) == without_wall_time(ref)
  assert metric_records(workdir) == metric_records(ref_dir)


def _two_processes(workdir, env, port):
  env = dict(env)
  env['XLA_FLAGS'] = env.get('XLA_FLAGS', '').replace(
      '--xla_force_host_platform_device_count=8', '--xla_force_host_platform_device_count=4')
  return [subprocess.Popen(
      TRAIN + SMOKE_ARGS + [f'--workdir={workdir}',
                            f'--config.distributed.coordinator_address=localhost:{port}',
                            '--config.distributed.num_processes=2',
                            f'--config.distributed.process_id={i}'],
      cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for i in range(2)]


def _finish(procs, timeout=400):
  try:
    errors = [p.communicate(timeout=timeout)[1] for p in procs]
    return [(p.returncode, err) for p, err in zip(procs, errors)]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


@pytest.mark.timeout(900)
def test_two_processes_agree_on_the_stop_step(tmp_path, subprocess_env):
  """SIGTERM to process 1 only, from outside, once training has logged: both processes stop after
  the same step (the first log or checkpoint step after it), save it, exit 143; the same command
  on both resumes there and completes."""
  workdir = tmp_path / 'two'
  procs = _two_processes(workdir, subprocess_env, free_port())
  deadline = time.time() + 300
  metrics = workdir / 'metrics.jsonl'
  while time.time() < deadline and procs[1].poll() is None:
    if metrics.exists() and metrics.read_text().strip():
      break
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)
  stopped = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
  steps = []
  for code, err in stopped:
    assert code == 128 + signal.SIGTERM, err[-3000:]
    last, _ = last_line(err)
    steps.append(int(last.split('after step ')[1].split(',')[0]))
  assert steps[0] == steps[1] and (steps[0] % EVERY == 0 or steps[0] % 5 == 0 or steps[0] == 22)
  assert steps[0] in saved_steps(workdir) and steps[0] < 44
  done = _finish(_two_processes(workdir, subprocess_env, free_port()))
  for code, err in done:
    assert code == 0, err[-3000:]
  assert f'at step {steps[0]}' in done[0][1]
  final = record.read_results(str(workdir))
  assert final['status'] == 'completed' and [h['epoch'] for h in final['history']] == [1, 2]
  keys = [(r['kind'], r['step']) for r in
          (json.loads(l) for l in metrics.read_text().splitlines())]
  assert len(keys) == len(set(keys)) and keys[-1] == ('epoch', 44)
