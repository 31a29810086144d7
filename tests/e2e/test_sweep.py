"""sweeps.sweep / sweeps.run_study: expansion, the command list, the SLURM script and skipping
(scheduling, locks, signals and a tiny end-to-end study: tests/e2e/test_sweep_scheduling.py)."""

import collections
import math
import os
import shlex
import subprocess

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags
from statsmodels.stats import power as smp

from analysis import stats
from configs import celeba, common, digits, validation
from runrecord import record, rules
from sweeps import runner, sweep
from tests.support.commands import write_config
from trainer import checkpoint

DIGITS = os.path.join(runner.REPO, 'configs', 'digits.py')


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
  """get_study's seeds = analysis.stats.seeds_needed on its declared inputs (paired, 80%
  power, alpha 0.05), = statsmodels' own solve_power; get_sweep runs that many seeds per arm."""
  declared = module.get_study()
  sd, margin, seeds = declared['paired_sd'], declared['margin'], declared['seeds']
  assert seeds == max(stats.seeds_needed(sd, margin, is_paired=True))
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
  os.chdir(runner.REPO)  # the lines are relative to the repository root
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
      f'--emit-commands={root / runner.COMMANDS_FILE}',
      f'--emit-slurm={root / runner.SLURM_FILE}',
    ]
  )
  runs, _, _ = sweep.expand('configs/digits.py:smoke,model.width=0.25', str(root))
  n = len(runs)
  assert code == 0 and f'0 completed (skipped), {n} to run' in capsys.readouterr().out
  lines = (root / runner.COMMANDS_FILE).read_text().splitlines()
  assert len(lines) == n
  for line, run in zip(lines, runs, strict=True):
    config, workdir = parse_train_command(line)
    expected = validation.resolve(
      common.apply_overrides(digits.get_config('smoke,model.width=0.25'), run.overrides.items())
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
  config, _ = parse_train_command(shlex.join(runner.command(run, DIGITS, 'smoke')))
  assert (
    config.to_dict()
    == validation.resolve(common.apply_overrides(digits.get_config('smoke'), odd.items())).to_dict()
  )
  script = (root / runner.SLURM_FILE).read_text()
  assert script.startswith('#!/bin/bash\n') and f'#SBATCH --array=0-{n - 1}\n' in script
  assert str(root / runner.COMMANDS_FILE) in script and f'{root}/.jax_cache' in script
  # Task 7 runs line 8 (0-based 7): a fake `python` records what it was given.
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'python').write_text(
    f'#!/bin/bash\necho "$PWD $JAX_COMPILATION_CACHE_DIR $*" > {tmp_path}/ran\n'
  )
  (bin_dir / 'python').chmod(0o755)
  env = {**os.environ, 'SWEEP_PYTHON': str(bin_dir / 'python'), 'SLURM_ARRAY_TASK_ID': '7'}
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  subprocess.run(['bash', str(root / runner.SLURM_FILE)], env=env, check=True, capture_output=True)
  assert (tmp_path / 'ran').read_text().split() == [
    runner.REPO,
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
      common.apply_overrides(
        digits.get_config('smoke'),
        {
          **run.overrides,
          'data.manual_dir': '/old/a',
          'data.tfds_dir': '/old/b',
          'data.cache_dir': '/old/c',
        }.items(),
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
  assert rules.config_differences(saved['config'], moved.to_dict()) == []
  mngr = checkpoint.manager(runs[1].workdir, 3)
  try:
    assert checkpoint.check_workdir_run(mngr, runs[1].workdir, moved, restart=False) is mngr
  finally:
    mngr.close()
