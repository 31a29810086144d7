"""Graceful stop (trainer/process.py): SIGTERM/SIGINT/SIGHUP/SIGUSR1 finish the step, save it, exit
128 + signal, the process gone at once after its line; before a session's first step, exit at once.

The signals are real: tests/support/fault_injection.py sends them to the process at a chosen step
(or inside the checkpoint write), the multi-process test sends one from outside to one of two.
"""

import signal
import subprocess
import threading
import time

import pytest

from runrecord import record
from tests.conftest import ROOT, cpu_xla_flags
from tests.support.commands import free_port
from tests.support.faults_common import (
  EVERY,
  FAULT_TRAIN,
  SMOKE_ARGS,
  TRAIN,
  last_line,
  metric_records,
  reference_run,
  run_train,
  saved_steps,
  without_wall_time,
)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  return reference_run(tmp_path_factory)


def _stopped_line(name, step):
  return (
    f'stopped: {name} received: stopped after step {step}, whose checkpoint is saved; run '
    'the same command again to resume'
  )


@pytest.mark.timeout(600)
def test_sigterm_saves_the_step_and_the_resumed_run_is_bit_identical(
  reference, tmp_path, subprocess_env
):
  """SIGTERM during step 13 (not a checkpoint step: 4, 8, 12, ...): step 13 is finished and saved,
  exit 143 with one line. Resumed, then SIGINT at step 17 and again while step 17's checkpoint is
  being written: the process ends at once (exit 130, its one line, no traceback). The same command
  then resumes from step 16 (or 17, if its write finished) and ends bit-identical to the
  uninterrupted run: no completed step lost."""
  ref_dir, ref = reference
  workdir = tmp_path / 'w'
  args = SMOKE_ARGS + [f'--workdir={workdir}']
  proc = run_train(args, subprocess_env, fault='term@step:13')
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  last, only_logs = last_line(proc.stderr)
  assert last == _stopped_line('SIGTERM', 13) and only_logs, proc.stderr[-3000:]
  assert 13 in saved_steps(workdir)
  saved = record.read_results(str(workdir))
  assert saved['status'] == 'running' and saved['step'] == 13
  assert [r['step'] for r in metric_records(workdir)] == [5, 10]
  proc = run_train(args, subprocess_env, fault='int@step:17,int@save:17')
  assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
  assert 'at step 13' in proc.stderr and 'Traceback' not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith('stopped: a second signal (SIGINT)')
  assert 16 in saved_steps(workdir)
  proc = run_train(args, subprocess_env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'at step 16' in proc.stderr or 'at step 17' in proc.stderr
  assert without_wall_time(record.read_results(str(workdir))) == without_wall_time(ref)
  assert metric_records(workdir) == metric_records(ref_dir)


@pytest.mark.timeout(300)
def test_sigint_at_any_moment_is_one_line_and_exit_130(tmp_path, subprocess_env):
  """Ctrl-C a few seconds in (importing, loading, compiling, or already training): exit 130 with
  one line, whichever it was: the graceful stop's, or, outside the loop, the immediate one's (no
  KeyboardInterrupt raised into JAX, which could crash the process)."""
  workdir = tmp_path / 'w'
  proc = subprocess.Popen(
    TRAIN + SMOKE_ARGS + [f'--workdir={workdir}'],
    cwd=ROOT,
    env=subprocess_env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  time.sleep(3)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=200)
  last, only_logs = last_line(err)
  assert proc.returncode == 128 + signal.SIGINT and only_logs, err[-3000:]
  assert last.startswith(
    (
      'stopped: SIGINT received: stopped after step ',
      'stopped: SIGINT received outside the training loop; the newest finished checkpoint stands',
      "stopped: SIGINT received before this session's first step: exited at once; the newest "
      'checkpoint (none yet) stands',
    )
  ), err[-3000:]


def _timed_run(command, env, signal_after=None, timeout=240):
  """(exit code, stderr, seconds from the `stopped:` line to the exit, seconds from the signal
  to the exit): `signal_after` = (a log line's text, delay s) sends SIGTERM that long after it."""
  proc = subprocess.Popen(
    command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )
  timer = threading.Timer(timeout, proc.kill)
  timer.start()
  lines, stopped, sent = [], None, None
  for line in proc.stderr:
    lines.append(line)
    if signal_after and sent is None and signal_after[0] in line:
      time.sleep(signal_after[1])
      proc.send_signal(signal.SIGTERM)
      sent = time.monotonic()
    if line.startswith('stopped:'):
      stopped = time.monotonic()
  code, end = proc.wait(), time.monotonic()
  timer.cancel()
  return code, ''.join(lines), end - (stopped or end), end - (sent or end)


@pytest.mark.timeout(600)
def test_usr1_and_hup_save_resume_bit_identically_and_the_process_is_gone_at_once(
  reference, tmp_path, subprocess_env
):
  """SIGUSR1 (SLURM's --signal warning) at step 9, then SIGHUP (the SSH session closing) at step
  30 of the resumed run: each saves its step, exits 128 + N with its line, the process gone within
  2 s of that line (measured here, 2 cores at load 5-9: 0.28-0.40 s; before the exit skipped
  Python's shutdown, 5.7-15.4 s at load 10-13); the same command then ends bit-identical to the
  uninterrupted run."""
  ref_dir, ref = reference
  workdir = tmp_path / 'w'
  command = FAULT_TRAIN + SMOKE_ARGS + [f'--workdir={workdir}']
  for fault, sig, step in (('usr1@step:9', signal.SIGUSR1, 9), ('hup@step:30', signal.SIGHUP, 30)):
    code, err, lingered, _ = _timed_run(command, dict(subprocess_env, TRAIN_FAULT=fault))
    assert code == 128 + sig, err[-3000:]
    last, only_logs = last_line(err)
    assert last == _stopped_line(sig.name, step) and only_logs, err[-3000:]
    assert lingered < 2, lingered
    assert step in saved_steps(workdir)
    assert record.read_results(str(workdir))['step'] == step
  code, err, _, _ = _timed_run(TRAIN + SMOKE_ARGS + [f'--workdir={workdir}'], subprocess_env)
  assert code == 0 and 'at step 30' in err, err[-3000:]
  assert without_wall_time(record.read_results(str(workdir))) == without_wall_time(ref)
  assert metric_records(workdir) == metric_records(ref_dir)


@pytest.mark.timeout(600)
def test_sigterm_during_the_first_compile_exits_at_once(tmp_path, subprocess_env):
  """SIGTERM 0.5 s and 3 s into the first compile of the training step (a cold compilation cache:
  the compile is real, 20-60 s here): exit 143 within 30 s (a preempted GCE VM's notice), one line
  saying the newest checkpoint stands, nothing saved. Measured on this 2-core host at load 5, signal
  to exit: 0.4 s (benchmarks/bench_stop_latency.py; before the watch thread: 78 s, the compile ran
  on, then a step and its save)."""
  for delay in (0.5, 3.0):
    env = dict(subprocess_env, JAX_COMPILATION_CACHE_DIR=str(tmp_path / f'cache{delay}'))
    workdir = tmp_path / f'w{delay}'
    command = TRAIN + SMOKE_ARGS + [f'--workdir={workdir}']
    code, err, _, seconds = _timed_run(command, env, ('Phase frozen', delay))
    assert code == 128 + signal.SIGTERM and seconds < 30, (seconds, err[-3000:])
    last, only_logs = last_line(err)
    assert only_logs and last == (
      "stopped: SIGTERM received before this session's first step: exited at once; the newest "
      'checkpoint (none yet) stands; run the same command again to resume'
    ), err[-3000:]
    assert not (workdir / 'checkpoints').exists() or saved_steps(workdir) == []


def _two_processes(workdir, env, port):
  env = dict(env)
  env['XLA_FLAGS'] = cpu_xla_flags(4)
  return [
    subprocess.Popen(
      TRAIN
      + SMOKE_ARGS
      + [
        f'--workdir={workdir}',
        f'--config.distributed.coordinator_address=localhost:{port}',
        '--config.distributed.num_processes=2',
        f'--config.distributed.process_id={i}',
      ],
      cwd=ROOT,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]


@pytest.mark.timeout(600)
def test_two_processes_agree_on_the_stop_step(tmp_path, subprocess_env):
  """SIGTERM to process 1 only, from outside, once training has logged: both processes stop after
  the same step (the first log or checkpoint step after it), save it and exit 143. (Resuming a
  2-process run from its checkpoint is test_multihost's.)"""
  workdir = tmp_path / 'two'
  procs = _two_processes(workdir, subprocess_env, free_port())
  try:
    deadline = time.time() + 300
    metrics = workdir / 'metrics.jsonl'
    while time.time() < deadline and procs[1].poll() is None:
      if metrics.exists() and metrics.read_text().strip():
        break
      time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    stopped = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  steps = []
  for code, err in stopped:
    assert code == 128 + signal.SIGTERM, err[-3000:]
    last, only_logs = last_line(err)
    assert only_logs, err[-3000:]
    steps.append(int(last.split('after step ')[1].split(',')[0]))
  stop_step = steps[0]
  assert steps == [stop_step, stop_step] and stop_step < 44
  assert stop_step % EVERY == 0 or stop_step % 5 == 0 or stop_step == 22  # a sync point
  assert stop_step in saved_steps(workdir)
  saved = record.read_results(str(workdir))
  assert saved['step'] == stop_step and saved['status'] == 'running'
  assert [r['step'] for r in metric_records(workdir)][-1] <= stop_step
