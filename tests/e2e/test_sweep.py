"""sweeps.sweep / sweeps.run_study: expansion, command list, SLURM script, skipping, scheduling,
and a tiny end-to-end study on digits (train.py subprocesses -> stats -> figures)."""

import collections
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags
from PIL import Image
from statsmodels.stats import power as smp

from analysis.inputs import results
from analysis.numbers import inference
from configs import celeba, common, digits, validation
from runrecord import record
from sweeps import run_study, runner, scripts, sweep
from tests.support.commands import write_config
from tests.support.planted_runs import fake_runs
from trainer import checkpointing, lock, resume, writers

DIGITS = os.path.join(scripts.REPO, 'configs', 'digits.py')


def test_digits_sweep_is_the_eight_arm_fraction_times_its_seeds_with_stable_unique_slugs(tmp_path):
  runs, path, arg = sweep.expand('configs/digits.py:study', str(tmp_path))
  seeds = digits.SEEDS
  assert (path, arg) == (DIGITS, 'study') and len(runs) == 8 * seeds
  assert [r.slug for r in runs[::seeds]] == [
    'profile-native_batchnorm_group-0_compute_dtype-float32',
    'profile-tpu-default_batchnorm_group-0_compute_dtype-float32',
    'profile-jax-gpu-default_batchnorm_group-0_compute_dtype-float32',
    'profile-torch-gpu-default_batchnorm_group-0_compute_dtype-float32',
    'profile-f32_batchnorm_group-0_compute_dtype-float32',
    'profile-native_batchnorm_group-16_compute_dtype-float32',  # per core: 128 / 8
    'profile-native_batchnorm_group-0_compute_dtype-bfloat16',
    'profile-bf16-noise_batchnorm_group-0_compute_dtype-float32',
  ]
  assert sorted({r.seed for r in runs}) == list(range(seeds))
  assert len({r.workdir for r in runs}) == len(runs)
  arm = runs[seeds + 2]
  assert (
    arm.workdir == f'{tmp_path}/profile-tpu-default_batchnorm_group-0_compute_dtype-float32/seed2'
  )
  assert arm.overrides == {
    'seed': 2,
    'numerics.profile': 'tpu_default',
    'numerics.batchnorm_group': 0,
    'numerics.compute_dtype': 'float32',
  }
  again, _, _ = sweep.expand('configs/digits.py:cpu', str(tmp_path))
  assert [r.workdir for r in again] == [r.workdir for r in runs]


def test_every_main_effect_of_the_digits_fraction_is_estimable():
  """Treatment-coded main effects of profile, BatchNorm grouping and dtype: full column rank."""
  arms = digits.study_arms(128)
  columns = [('numerics.profile', p) for p in celeba.PROFILES[1:] + (celeba.NOISE_PROFILE,)]
  columns += [('numerics.batchnorm_group', 16), ('numerics.compute_dtype', 'bfloat16')]
  X = np.array([[1.0] + [float(arm[f] == v) for f, v in columns] for arm in arms])
  assert np.linalg.matrix_rank(X) == X.shape[1] == len(arms)


@pytest.mark.parametrize('module', [digits, celeba])
def test_declared_seed_count_is_the_power_calculation(module):
  """get_study's seeds = analysis.numbers.inference.seeds_needed on its declared inputs (paired, 80%
  power, alpha 0.05), = statsmodels' own solve_power; get_sweep runs that many seeds per arm."""
  declared = module.get_study()
  sd, margin, seeds = declared['paired_sd'], declared['margin'], declared['seeds']
  assert seeds == max(inference.seeds_needed(sd, margin, is_paired=True))
  solver = smp.TTestPower()
  assert seeds == max(
    math.ceil(solver.solve_power(margin / sd, alpha=0.05, power=0.8)),
    math.ceil(solver.solve_power(margin / sd, alpha=0.05, power=0.9, alternative='larger')),
  )
  per_arm = collections.Counter(
    tuple(sorted((k, v) for k, v in run.items() if k != 'seed')) for run in module.get_sweep()
  )
  assert set(per_arm.values()) == {seeds}
  assert declared['seed_sd_source'] and declared['paired_sd_source'] and declared['margin_reason']
  assert declared['noise_arm'] == {'profile': 'bf16_noise'}
  assert set(declared['reference']) <= set(declared['factors'])


def test_slug_depends_on_the_arm_alone_and_disambiguates_shared_leaf_names():
  leaves = common.fields(digits.get_config())
  assert sweep.arm_slug({'numerics.profile': 'tpu_default'}, leaves) == 'profile-tpu-default'
  assert sweep.arm_slug({}, leaves) == 'default'
  # `name` is both data.name and model.name: the dotted name keeps the slug unambiguous.
  assert (
    sweep.arm_slug({'data.name': 'digits', 'model.width': 0.5}, leaves)
    == 'data.name-digits_width-0.5'
  )
  assert sweep.arm_slug({'model.reinit': ('stem', 'head')}, leaves) == 'reinit-stem-head'


def test_celeba_sweep_is_the_full_factorial_plus_the_noise_control(tmp_path):
  runs, _, _ = sweep.expand('configs/celeba.py:smoke', str(tmp_path))
  arms = list(dict.fromkeys(r.slug for r in runs))
  assert len(arms) == 5 * 2 * 2 + 1 and len(runs) == len(arms) * celeba.SEEDS
  assert {r.seed for r in runs} == set(range(celeba.SEEDS))
  assert arms[0] == 'profile-native_batchnorm_group-0_compute_dtype-float32'
  assert arms[-1] == 'profile-bf16-noise_batchnorm_group-0_compute_dtype-float32'
  assert 'profile-torch-gpu-default_batchnorm_group-4_compute_dtype-bfloat16' in arms  # 32 / 8
  full = celeba.get_sweep()  # the default batch: per-core groups of 2048 / 8
  assert {r['numerics.batchnorm_group'] for r in full} == {0, 256}
  assert {r['numerics.profile'] for r in full} == set(celeba.PROFILES) | {'bf16_noise'}


@pytest.mark.parametrize(
  'body, message',
  [
    ("[{'numerics.emulat': 'bf16', 'seed': 0}]", 'unknown config field numerics.emulat'),
    ("[{'seed': 1}, {'seed': 1}]", 'lists seed 1 twice'),
    (
      "[{'data.manual_dir': 'a/b', 'seed': 0}, {'data.manual_dir': 'a_b', 'seed': 0}]",
      'share the folder',
    ),
    ('[]', 'non-empty list'),
  ],
)
def test_bad_sweeps_are_one_line_errors(tmp_path, body, message):
  with pytest.raises(ValueError, match=message) as e:
    sweep.expand(write_config(tmp_path, body), str(tmp_path / 'r'))
  assert '\n' not in str(e.value)


def test_missing_get_sweep_and_bad_flags_exit_2(tmp_path, capsys):
  (tmp_path / 'plain.py').write_text('from configs import digits\nget_config = digits.get_config\n')
  assert sweep.main([f'--config={tmp_path}/plain.py', f'--root={tmp_path}/r']) == 2
  assert 'has no get_sweep' in capsys.readouterr().err
  assert sweep.main(['--config=configs/digits.py', f'--root={tmp_path}', '--gpus=0,x']) == 2
  assert (
    sweep.main(['--config=configs/digits.py', f'--root={tmp_path}', '--gpus=0', '--parallel=2'])
    == 2
  )
  assert sweep.main(['--config=configs/digits.py', '--root=gs://bucket/s']) == 2
  assert '--root=gs://bucket/s' in capsys.readouterr().err


def parse_train_command(line):
  """The config that train.py's own flags build from one command-list line."""
  argv = shlex.split(line)
  assert argv[:2] == ['python', 'train.py']
  values = flags.FlagValues()
  config_flags.DEFINE_config_file(
    'config', None, '', flag_values=values, lock_config=True, sys_argv=argv[1:]
  )
  flags.DEFINE_string('workdir', None, '', flag_values=values)
  cwd = os.getcwd()
  os.chdir(scripts.REPO)  # the lines are relative to the repository root
  try:
    values(argv[1:])
  finally:
    os.chdir(cwd)
  return validation.resolve(values.config), values.workdir  # as train.py resolves it


def test_command_list_reproduces_each_run_and_slurm_runs_its_line(tmp_path, capsys):
  root = tmp_path / 'study'
  code = sweep.main(
    [
      '--config=configs/digits.py:smoke,model.width=0.25',
      f'--root={root}',
      '--dry-run',
      f'--emit-commands={root / scripts.COMMANDS_FILE}',
      f'--emit-slurm={root / scripts.SLURM_FILE}',
    ]
  )
  runs, _, _ = sweep.expand('configs/digits.py:smoke,model.width=0.25', str(root))
  n = len(runs)
  assert code == 0 and f'0 completed (skipped), {n} to run' in capsys.readouterr().out
  lines = (root / scripts.COMMANDS_FILE).read_text().splitlines()
  assert len(lines) == n
  for line, run in zip(lines, runs, strict=True):
    config, workdir = parse_train_command(line)
    expected = validation.resolve(
      sweep.check_overrides(digits, 'smoke,model.width=0.25', run.overrides, 0)
    )
    assert workdir == run.workdir and config.to_dict() == expected.to_dict()
    assert run.config.to_dict() == expected.to_dict()  # expand keeps each run's resolved config
  # Tuples, bools and floats survive the command line too.
  odd = {
    'seed': 4,
    'model.reinit': ('stem',),
    'numerics.gpu_deterministic': True,
    'model.width': 0.5,
  }
  run = sweep.Run(odd, 'odd', 4, odd, str(root / 'odd'))
  config, _ = parse_train_command(scripts.command_line(scripts.command(run, DIGITS, 'smoke')))
  assert (
    config.to_dict() == validation.resolve(sweep.check_overrides(digits, 'smoke', odd, 0)).to_dict()
  )
  script = (root / scripts.SLURM_FILE).read_text()
  assert script.startswith('#!/bin/bash\n') and f'#SBATCH --array=0-{n - 1}\n' in script
  assert str(root / scripts.COMMANDS_FILE) in script and f'{root}/.jax_cache' in script
  # Task 7 runs line 8 (0-based 7): a fake `python` records what it was given.
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'python').write_text(
    f'#!/bin/bash\necho "$PWD $JAX_COMPILATION_CACHE_DIR $*" > {tmp_path}/ran\n'
  )
  (bin_dir / 'python').chmod(0o755)
  env = {**os.environ, 'SWEEP_PYTHON': str(bin_dir / 'python'), 'SLURM_ARRAY_TASK_ID': '7'}
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  subprocess.run(['bash', str(root / scripts.SLURM_FILE)], env=env, check=True, capture_output=True)
  assert (tmp_path / 'ran').read_text().split() == [
    scripts.REPO,
    f'{root}/.jax_cache',
  ] + shlex.split(lines[7])[1:]


def test_emit_paths_and_a_completed_run_is_skipped_an_unfinished_one_relaunched(tmp_path, capsys):
  root = str(tmp_path / 'r')
  runs, _, _ = sweep.expand('configs/digits.py:smoke', root)
  done = runs[0].config.to_dict()  # as train.py saves it: resolved
  record.write_results(runs[0].workdir, {'status': 'completed', 'config': done}, step=5)
  unfinished = runs[1].config.to_dict()
  record.write_results(runs[1].workdir, {'status': 'running', 'config': unfinished}, step=2)
  code = sweep.main(
    [
      '--config=configs/digits.py:smoke',
      f'--root={root}',
      '--dry-run',
      f'--emit-commands={tmp_path}/c.txt',
      f'--emit-slurm={tmp_path}/s.sbatch',
    ]
  )
  out = capsys.readouterr().out
  assert code == 0 and f'1 completed (skipped), {len(runs) - 1} to run' in out
  assert f'--workdir={runs[1].workdir} ' in out and f'--workdir={runs[0].workdir} ' not in out
  assert len((tmp_path / 'c.txt').read_text().splitlines()) == len(runs)
  assert f'{tmp_path}/c.txt' in (tmp_path / 's.sbatch').read_text()


def test_rerun_after_moving_the_data_skips_completed_and_resumes_unfinished(tmp_path, capsys):
  """Moving data.manual_dir / tfds_dir / cache_dir changes no run: the sweep skips the completed
  runs and relaunches the unfinished ones, which train.py resumes: both by record's one rule."""
  root = str(tmp_path / 'r')
  runs, _, _ = sweep.expand('configs/digits.py:smoke', root)
  for i, run in enumerate(runs[:2]):
    saved = validation.resolve(
      sweep.check_overrides(
        digits,
        'smoke',
        {
          **run.overrides,
          'data.manual_dir': '/old/a',
          'data.tfds_dir': '/old/b',
          'data.cache_dir': '/old/c',
        },
        0,
      )
    )
    record.write_results(
      run.workdir,
      {'status': 'completed' if i == 0 else 'running', 'config': saved.to_dict()},
      step=5,
    )
  code = sweep.main(['--config=configs/digits.py:smoke', f'--root={root}', '--dry-run'])
  out = capsys.readouterr().out
  assert code == 0 and f'1 completed (skipped), {len(runs) - 1} to run' in out
  assert f'--workdir={runs[1].workdir}' in out and f'--workdir={runs[0].workdir} ' not in out
  # train.py's resume applies the same rule to the moved run: it continues it.
  moved = runs[1].config
  saved = record.read_results(runs[1].workdir)
  assert record.config_differences(saved['config'], moved.to_dict()) == []
  mngr = checkpointing.manager(runs[1].workdir, 3)
  try:
    assert resume.check_workdir_run(mngr, runs[1].workdir, moved, restart=False) is mngr
  finally:
    mngr.close()


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
    scripts.REPO,
    progress,
    2,
    [5, 7, 9],
    poll=0.05,
  )
  assert [(f[0].workdir, f[1], f[2]) for f in failures] == [(runs[3].workdir, 3, 'boom')]
  assert (in_use, signum) == ([], None)
  assert (progress.done, progress.failed, progress.active) == (6, 1, {})
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
  assert writers.duration(3725) == '1h2m05s'


def test_one_duration_format_for_the_consoles():
  """trainer/writers.duration: the sweep's lines, the lockstep divergence's and (clock) the
  training line's ETA, rounded to the second (the ETA was truncated before)."""
  assert writers.duration(3725) == '1h2m05s' and writers.duration(59.6) == '1m00s'
  assert writers.duration(3725.4, clock=True) == '1:02:05'
  assert writers.duration(59.6, clock=True) == '0:01:00'
  assert writers.duration(None) == '?' and writers.duration(-3) == '0m00s'


def test_tiny_study_end_to_end_then_resume_skips_everything(
  tmp_path, subprocess_env, monkeypatch, capsys
):
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', subprocess_env['JAX_COMPILATION_CACHE_DIR'])
  monkeypatch.setenv('XLA_FLAGS', '')  # one CPU device: the cheapest compile
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
  runs = results.load_runs(str(root))
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
  with open(os.path.join(workdir, results.METRICS_FILE), 'w') as f:
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
  progress.durations = [100.0]  # a finished run's duration wins over the estimate
  assert progress.eta(measures) == pytest.approx((8 + 40 + 2 * 100) / 2)
  line = progress.line(now)
  assert line.startswith('[sweep] 1/5 done, 2 running (200 images/s, 1 starting), 0 failed')
  assert line.endswith('ETA 2m04s')
  progress.durations, progress.active = [], {0: progress.active[1]}
  assert progress.eta([measures[1]]) is None and 'ETA ?' in progress.line(now)


def hold_lock(workdir, seconds):
  """A process holding the workdir's run lock for `seconds`, returned once it holds it."""
  holder = subprocess.Popen(
    [
      sys.executable,
      '-c',
      (
        'import sys, time; sys.path.insert(0, sys.argv[1]); from trainer import lock; '
        'l = lock.WorkdirLock(sys.argv[2]).acquire(); print("held", flush=True); '
        'time.sleep(float(sys.argv[3]))'
      ),
      scripts.REPO,
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
  assert lock.holder(workdir) is None
  with lock.WorkdirLock(workdir):
    assert lock.holder(workdir)['pid'] == os.getpid()
  assert lock.holder(workdir) is None
  holder = hold_lock(workdir, 60)
  try:
    assert lock.holder(workdir)['pid'] == holder.pid
  finally:
    holder.kill()
    holder.wait()
  assert lock.holder(workdir) is None  # the kernel released the dead holder's lock


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
      scripts.REPO,
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
  assert (progress.done, progress.failed, progress.in_use) == (1, 0, 1)
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
    cwd=scripts.REPO,
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
  env = {**subprocess_env, 'XLA_FLAGS': ''}  # one CPU device: the cheapest compile
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
    cwd=scripts.REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  assert 'FAILED' not in rerun.stdout and '[sweep] 2/2 done, 0 running' in rerun.stdout
  assert sorted(results.load_runs(str(root))['status']) == ['completed'] * 2
