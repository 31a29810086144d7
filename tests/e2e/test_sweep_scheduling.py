"""sweeps.run_study's scheduling: one run per GPU with failures reported, the launch order, progress
and ETA, workdir locks held by live, released and dead runs, signals that stop every run, and a
tiny end-to-end study on digits (train.py subprocesses -> stats -> figures) resumed."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from PIL import Image

from analysis import inputs
from sweeps import run_study, runner, sweep
from tests.conftest import cpu_xla_flags
from tests.support.commands import write_config
from tests.support.planted_runs import fake_runs
from trainer import checkpoint, metrics


def test_scheduler_one_run_per_gpu_reports_failures_and_continues(tmp_path, monkeypatch, capsys):
  script = (
    'import os, sys, time; time.sleep(0.3); print("gpu", os.environ["CUDA_VISIBLE_DEVICES"], '
    'os.environ["JAX_COMPILATION_CACHE_DIR"]); print("boom" if "seed1" in sys.argv[-1] else "ok"); '
    'sys.exit(3 if "a-1/seed1" in sys.argv[-1] else 0)'
  )
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  runs = fake_runs(tmp_path, 6)
  progress = runner.Progress(7, 1, 2)
  failures, in_use, signum = runner.run_all(
    runs,
    lambda run: [sys.executable, '-c', script, run.workdir],
    str(tmp_path),
    progress,
    2,
    [5, 7, 9],
    poll=0.05,
  )
  assert [(f[0].workdir, f[1], f[2]) for f in failures] == [(runs[3].workdir, 3, 'boom')]
  assert (in_use, signum) == ([], None)
  assert (progress.done, len(progress.failures), progress.active) == (6, 1, {})
  out = capsys.readouterr().out
  log3 = f'{runs[3].workdir}/train.log'
  assert f"FAILED  a-1/seed1: exit code 3, last log line: 'boom' (log: {log3})" in out
  assert 'start   a-1/seed1 on GPU ' in out and f'workdir {runs[3].workdir}, log {log3}' in out
  assert '[sweep] 6/7 done, 0 running, 1 failed | elapsed 0m0' in out
  assert 'ETA 0m00s' in out
  logs = [open(os.path.join(r.workdir, 'train.log')).read() for r in runs]
  assert all(f'{tmp_path}/.jax_cache' in log for log in logs)
  assert {log.split('gpu ')[1].split()[0] for log in logs} == {'5', '7'}
  running = [
    int(line.split(' running')[0].split()[-1])
    for line in out.splitlines()
    if line.startswith('[sweep]')
  ]
  assert max(running) == 2


def test_launch_order_round_robins_arms():
  runs = [sweep.Run({}, arm, seed, {}, '') for arm in 'abc' for seed in range(2)]
  assert [(r.slug, r.seed) for r in sweep.launch_order(runs)] == [
    ('a', 0),
    ('b', 0),
    ('c', 0),
    ('a', 1),
    ('b', 1),
    ('c', 1),
  ]
  assert metrics.duration(3725) == '1h2m05s'


def test_one_duration_format_for_the_consoles():
  """trainer/metrics.duration: the sweep's lines, the lockstep divergence's and (clock) the
  training line's ETA, rounded to the second (the ETA was truncated before)."""
  assert metrics.duration(3725) == '1h2m05s' and metrics.duration(59.6) == '1m00s'
  assert metrics.duration(3725.4, clock=True) == '1:02:05'
  assert metrics.duration(59.6, clock=True) == '0:01:00'
  assert metrics.duration(None) == '?' and metrics.duration(-3) == '0m00s'


def test_tiny_study_end_to_end_then_resume_skips_everything(
  tmp_path, subprocess_env, monkeypatch, capsys
):
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', subprocess_env['JAX_COMPILATION_CACHE_DIR'])
  monkeypatch.setenv('XLA_FLAGS', cpu_xla_flags(1))  # one CPU device: the cheapest compile
  cfg = write_config(
    tmp_path, "[{'numerics.profile': p, 'seed': s} for p in ('f32', 'tpu_default') for s in (0, 1)]"
  )
  root = tmp_path / 'study'
  spec = f'--config={cfg}:smoke,num_epochs=2,optim.freeze_epochs=0'
  assert run_study.main([spec, f'--root={root}', '--parallel=1']) == 0
  out = capsys.readouterr().out
  assert '[sweep] 4/4 done, 0 running, 0 failed' in out and 'study finished in' in out
  report = (root / 'report.md').read_text()
  # Arms labelled by the first requested field that separates them: the named shorthand first.
  assert report in out and 'profile=tpu_default' in report and 'profile=f32' in report
  assert 'conv_format=' not in report.split('## Arms')[1].split('## Comparisons: every test')[0]
  assert (root / 'report.tex').exists() and list(root.glob('report_*.csv'))
  log = (root / 'profile-tpu-default' / 'seed1' / 'train.log').read_text()
  assert 'train.py --config=' in log and 'Done: test_accuracy' in log
  runs = inputs.load_runs(str(root))
  assert sorted(runs['status']) == ['completed'] * 4
  pngs = sorted((root / 'figures').glob('*.png'))
  assert {p.stem for p in pngs} >= {'accuracy_by_arm', 'contrasts', 'training_curves'}
  for png in pngs:
    with Image.open(png) as img:
      img.load()
      assert img.size[0] > 600
  assert sweep.main([spec, f'--root={root}']) == 0
  assert '4 completed (skipped), 0 to run' in capsys.readouterr().out


def write_train_records(workdir, records, log_counter=None):
  """metrics.jsonl training records [(step, images/s)] and, optionally, a log with `step s/T`."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, inputs.METRICS_FILE), 'w') as f:
    for step, ips in records:
      f.write(json.dumps({'kind': 'train', 'step': step, 'images_per_sec': ips}) + '\n')
    f.write('{"kind": "tr')  # a torn last line
  if log_counter:
    with open(os.path.join(workdir, runner.LOG_FILE), 'w') as f:
      f.write(f'I1124 reporting.py:66] step {log_counter} (epoch 1/2) loss 2.6 | 28 img/s\n')


def test_progress_speed_leaves_out_compile_and_eta_counts_running_and_queued(tmp_path):
  a, b = str(tmp_path / 'a'), str(tmp_path / 'b')
  # a: resumed at step 10; after launch the first interval (compile, 5 img/s) is left out.
  write_train_records(
    a, [(5, 900.0), (10, 1000.0), (15, 5.0), (20, 100.0), (25, 300.0), (30, 200.0)], '30/110'
  )
  write_train_records(b, [(5, 3.0)], '5/110')  # still compiling: only the first interval
  assert runner.speed(a, 10) == (200.0, 30) and runner.speed(b, 0) == (None, 5)
  assert runner.last_step(a) == 30 and runner.last_step(str(tmp_path / 'none')) == -1
  now = 1000.0
  runs = [sweep.Run({}, 'x', s, {}, w) for s, w in ((0, a), (1, b))]
  progress = runner.Progress(total=5, done=1, slots=2)
  progress.active = {
    i: runner.Active(r, None, None, None, now - 60, 20, since)
    for i, (r, since) in enumerate(zip(runs, (10, 0), strict=True))
  }
  measures = [x.measure(now) for x in progress.active.values()]
  assert measures == [(200.0, 60.0, 80 * 20 / 200.0), (None, 60.0, None)]
  # Per run: a's elapsed + left = 68 s (no run finished yet); b: 68 - 60 s left; 2 queued runs.
  assert progress.eta(measures) == pytest.approx((8 + 8 + 2 * 68) / 2)
  progress.durations = [(100.0, 100.0)]  # a finished run's duration wins over the estimate
  assert progress.eta(measures) == pytest.approx((8 + 40 + 2 * 100) / 2)
  line = progress.line(now)
  assert line.startswith('[sweep] 1/5 done, 2 running (200 images/s, 1 starting), 0 failed')
  assert line.endswith('ETA 2m04s')
  progress.durations, progress.active = [], {0: progress.active[1]}
  assert progress.eta([measures[1]]) is None and 'ETA ?' in progress.line(now)


def planted(arms=8, seeds=6, slots=2, cold=(20, 100, 30), warm=(20, 5, 30)):
  """[(slug, start, end, compile s)] of a sweep in launch order (each arm's first seed, then the
  second, ...), `slots` at a time; a run: start-up, compile (cold: its arm's first), steps."""
  free, out, seen = [0.0] * slots, [], set()
  for _ in range(seeds):
    for arm in range(arms):
      parts = warm if arm in seen else cold
      seen.add(arm)
      start = free.pop(free.index(min(free)))
      out.append((f'a{arm}', start, start + sum(parts), parts[1], parts[0] + parts[1]))
      free.append(out[-1][2])
  return out


def eta_ratios(schedule, slots=2, plain=False):
  """ETA / the truth at each run's end, the runs' logged compiles as runner.compile_s finds them;
  `plain`: every queued run at a finished run's mean duration (the ETA before)."""
  end, ratios = max(e for _, _, e, _, _ in schedule), []
  for t in sorted({e for _, _, e, _, _ in schedule} - {end}):
    finished = [(e - s, e - s - (0 if plain else c)) for _, s, e, c, _ in schedule if e <= t]
    running = [(s, e, before) for _, s, e, _, before in schedule if s <= t < e]
    progress = runner.Progress(len(schedule), len(finished), slots)
    progress.durations, progress.active = finished, dict(enumerate(running))
    if not plain:
      progress.unlaunched = {a for a, *_ in schedule} - {a for a, s, *_ in schedule if s <= t}
    measures = [(1.0, t - s, e - t if t - s >= before else None) for s, e, before in running]
    ratios.append(progress.eta(measures) / (end - t))
  return ratios


def test_the_eta_is_within_2x_of_the_truth_from_the_first_finished_run_on(tmp_path):
  """Before: 'make study' showed 1 h 59 min where 48 min remained: each queued seed priced as its
  arm's first run, whose compile later seeds load from the cache. Planted: 8 arms x 6 seeds, 2 at
  a time, a first run 150 s (100 s of compile), a later one 55 s."""
  w = str(tmp_path / 'w')  # 5 steps a record at batch 20: compiles where the speed drops
  write_train_records(w, [(5, 5.0), (10, 200.0), (15, 200.0), (20, 200.0), (25, 100.0)], '25/25')
  assert runner.compile_s(w, -1, 20) == pytest.approx(100 * (1 / 5 - 1 / 200 + 1 / 100 - 1 / 200))
  schedule = planted()
  ratios = eta_ratios(schedule)
  assert all(0.5 <= r <= 2 for r in ratios), [round(r, 2) for r in ratios]
  assert max(eta_ratios(schedule, plain=True)) > 2  # the plain mean misses by more


def hold_lock(workdir, seconds):
  """A process holding the workdir's run lock for `seconds`, returned once it holds it."""
  holder = subprocess.Popen(
    [
      sys.executable,
      '-c',
      (
        'import sys, time; sys.path.insert(0, sys.argv[1]); from trainer import checkpoint; '
        'l = checkpoint.WorkdirLock(sys.argv[2]).acquire(); print("held", flush=True); '
        'time.sleep(float(sys.argv[3]))'
      ),
      runner.REPO,
      workdir,
      str(seconds),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  assert holder.stdout.readline() == 'held\n'
  return holder


def test_lock_holder_sees_a_live_run_and_not_a_released_or_dead_one(tmp_path):
  workdir = str(tmp_path / 'run')
  os.makedirs(workdir)
  assert checkpoint.holder(workdir) is None
  with checkpoint.WorkdirLock(workdir):
    assert checkpoint.holder(workdir)['pid'] == os.getpid()
  assert checkpoint.holder(workdir) is None
  holder = hold_lock(workdir, 60)
  try:
    assert checkpoint.holder(workdir)['pid'] == holder.pid
  finally:
    holder.kill()
    holder.wait()
  assert checkpoint.holder(workdir) is None  # the kernel released the dead holder's lock


def test_a_held_workdir_is_waited_for_then_run_or_reported_in_use_not_failed(
  tmp_path, monkeypatch, capsys
):
  monkeypatch.setattr(runner, 'LOCK_WAIT_S', 4.0)
  runs = fake_runs(tmp_path, 2)
  for run in runs:
    os.makedirs(run.workdir)
  lasting = hold_lock(runs[1].workdir, 60)
  brief = hold_lock(runs[0].workdir, 1.5)  # still held when the sweep reaches run 0
  try:
    progress = runner.Progress(2, 0, 1)
    failures, in_use, signum = runner.run_all(
      runs,
      lambda run: [sys.executable, '-c', 'print("ran")'],
      str(tmp_path),
      progress,
      1,
      [],
      poll=0.05,
    )
  finally:
    lasting.kill()
    lasting.wait()
    brief.wait()
  assert (failures, in_use, signum) == ([], [runs[1]], None)
  assert (progress.done, len(progress.failures), len(progress.held)) == (1, 0, 1)
  assert 'ran' in open(os.path.join(runs[0].workdir, 'train.log')).read()
  assert not os.path.exists(os.path.join(runs[1].workdir, 'train.log'))
  out = capsys.readouterr().out
  assert f'waiting: {runs[0].workdir} is held by pid {brief.pid}' in out
  assert '1 in use elsewhere' in out


def train_processes(root):
  """PIDs of live processes whose command line names `root` and train.py."""
  found = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read().decode(errors='replace')
      with open(f'/proc/{pid}/stat') as f:
        zombie = f.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except OSError:
      continue
    if str(root) in cmdline and 'train.py' in cmdline and not zombie:
      found.append(int(pid))
  return found


def start_sweep(argv, env, out):
  return subprocess.Popen(
    [sys.executable, '-m', 'sweeps.sweep', *argv],
    cwd=runner.REPO,
    env=env,
    stdout=out,
    stderr=subprocess.STDOUT,
  )


def wait_until(condition, timeout, what):
  deadline = time.time() + timeout
  while not condition():
    assert time.time() < deadline, f'timed out waiting for {what}'
    time.sleep(0.2)


def test_signals_stop_every_run_and_the_rerun_completes_them(tmp_path, subprocess_env):
  """SIGTERM: forwarded to both runs, waited for (exit 143); SIGKILL: the runs die with the sweep;
  the rerun then completes both runs (no run 'in use', none failed)."""
  env = {**subprocess_env, 'XLA_FLAGS': cpu_xla_flags(1)}  # one CPU device: the cheapest compile
  cfg = write_config(tmp_path, "[{'seed': s} for s in (0, 1)]")
  root = tmp_path / 'study'
  argv = [
    f'--config={cfg}:smoke,optim.freeze_epochs=0,num_epochs=1',
    f'--root={root}',
    '--parallel=2',
    '--heartbeat=1',
  ]
  for sig in (signal.SIGTERM, signal.SIGKILL):
    with open(tmp_path / f'{sig.name}.txt', 'w') as out:
      proc = start_sweep(argv, env, out)
      wait_until(lambda: len(train_processes(root)) == 2, 120, 'both runs to start')
      proc.send_signal(sig)
      assert proc.wait(timeout=300) == (128 + sig if sig == signal.SIGTERM else -sig)
      if sig == signal.SIGTERM:
        assert train_processes(root) == []  # the sweep waited for them
      wait_until(lambda: not train_processes(root), 10, 'the runs to die with the sweep')
  text = (tmp_path / 'SIGTERM.txt').read_text()
  assert 'stopping: SIGTERM sent to 2 running run(s)' in text and 'stopped by SIGTERM' in text
  rerun = subprocess.run(
    [sys.executable, '-m', 'sweeps.sweep', *argv],
    cwd=runner.REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  assert 'FAILED' not in rerun.stdout and '[sweep] 2/2 done, 0 running' in rerun.stdout
  assert sorted(inputs.load_runs(str(root))['status']) == ['completed'] * 2
