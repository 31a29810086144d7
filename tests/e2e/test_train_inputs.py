"""Training-side numbers checked where they enter (issue 36, cases 4, 5, 12, 13 and the minor
ones): the seeds in the PRNG's range naming the field, eval_batch_size through the memory check
and no evaluation batch padded past the test set, the batch against the devices a sweep run sees,
a resume onto another platform identity refused (or a platform of its own), a config field given
twice, a config path holding ':' -- one line, exit 2, no traceback, nothing written, from train.py
and from the sweep and its --dry-run alike."""

import os
import shutil

import numpy as np
import pytest

import input_pipeline
from analysis import inputs
from configs import common, digits, validation
from input_pipeline import batching
from runrecord import record, rules
from sweeps import sweep
from tests.support.commands import assert_one_line_refusal, write_config
from tests.support.faults_common import run_train, smoke_config, tree_hash
from trainer import train


def resolve(**overrides):
  return validation.resolve(common.apply_overrides(digits.get_config('smoke'), overrides.items()))


@pytest.mark.parametrize(
  'field, value',
  [
    ('init_seed', 2**32),
    ('init_seed', -1),
    ('data_seed', 2**32),
    ('data_seed', True),
    ('data.split_seed', -1),
    ('data.split_seed', 2**32),
  ],
)
def test_every_seed_is_in_the_prngs_range_naming_its_field(field, value):
  """Case 4: init_seed 2^32 trained as init seed 0 (and -1 as 2^32 - 1), recorded as given; case
  12: data_seed 2^32 an OverflowError once the workdir existed; split_seed -1 named sklearn's
  random_state. All three passed resolution (and the sweep's --dry-run)."""
  with pytest.raises(validation.ConfigError) as e:
    resolve(**{field: value})
  assert str(e.value).startswith(f'config.{field} must be an integer in [0, 4294967295] (')
  assert str(e.value).endswith(f'got {value!r}')
  assert resolve(init_seed=None, data_seed=2**32 - 1).data_seed == 2**32 - 1


TRAIN_CASES = [
  (['--config.data_seed=4294967296'], 'config.data_seed must be an integer in [0, 4294967295]'),
  (['--config.init_seed=4294967296'], 'config.init_seed must be an integer in [0, 4294967295]'),
  (['--config.data.split_seed=-1'], 'config.data.split_seed must be an integer in [0, 4294967295]'),
  (
    ['--config.eval_batch_size=4194304', '--config.data.image_size=224'],
    'config.eval_batch_size=4194304: an evaluation step holds at least',
  ),
  (['--config.seed=1', '--config.seed=2'], '--config.seed is given twice (1 and 2): give it once'),
]


@pytest.mark.parametrize('args, message', TRAIN_CASES, ids=[c[1][:30] for c in TRAIN_CASES])
def test_train_py_refuses_in_one_line_before_the_workdir_exists(
  args, message, tmp_path, subprocess_env
):
  workdir = tmp_path / 'new' / 'w'
  proc = run_train(
    ['--config=configs/digits.py:smoke', f'--workdir={workdir}'] + args, subprocess_env, timeout=120
  )
  assert_one_line_refusal(proc, message, tmp_path / 'new')


def test_a_config_path_holding_a_colon_is_found(tmp_path):
  """Before: '--config=runs/a:b/cfg.py:smoke' read 'give a config file' (split at the first ':')."""
  folder = tmp_path / 'a:b'
  folder.mkdir()
  shutil.copy(os.path.join(common.REPO, 'configs', 'digits.py'), folder / 'cfg.py')
  assert common.load(f'{folder}/cfg.py:smoke').batch_size == digits.get_config('smoke').batch_size
  with pytest.raises(ValueError, match=r'seed is given twice after the colon \(1 and 2\)'):
    common.load('configs/digits.py:smoke,seed=1,seed=2')
  assert common.load('configs/digits.py:smoke', [('seed', '3'), ('seed', '3')]).seed == 3


def test_the_sweep_and_its_dry_run_refuse_the_same(tmp_path, capsys):
  """The sweep (and --dry-run) passed data_seed 2^32 and split_seed -1 (every run would crash),
  and a batch the devices do not divide (each run exited 2 once its folder and log existed)."""
  cfg = write_config(
    tmp_path,
    "[{'seed': 0, 'data_seed': 2**32}, {'seed': 1, 'init_seed': -1}, "
    "{'seed': 2, 'data.split_seed': -1}, {'seed': 3, 'batch_size': 60}]",
  )
  for extra in (['--dry-run'], []):
    assert sweep.main([f'--config={cfg}:smoke', f'--root={tmp_path / "root"}', *extra]) == 2
    err = capsys.readouterr().err
    assert 'config.data_seed must be an integer in [0, 4294967295]' in err
    assert 'config.init_seed must be an integer' in err and 'config.data.split_seed must be' in err
    assert (
      'config.batch_size=60 is not divisible by the 8 devices: use a multiple of 8 (the 8 '
      'cpu device(s) a run of this sweep sees) (runs: batch_size-60/seed3)'
    ) in err
    assert (
      err.strip().splitlines()[-1]
      == ('error: 4 problem(s) found before launching: nothing was run or written')
      and 'Traceback' not in err
    )
    assert not (tmp_path / 'root').exists()


def test_the_devices_are_counted_with_the_runs_own_environment(tmp_path):
  cfg = write_config(tmp_path, "[{'seed': 0}]")
  (run,), _, _ = sweep.expand(f'{cfg}:smoke', str(tmp_path / 'root'))
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=3'}
  errors, warnings = sweep.device_problems([run], env)
  assert warnings == [] and errors[0].startswith(
    'config.batch_size=64 is not divisible by the 3 devices: use a multiple of 3 (the 3 cpu'
  )
  assert sweep.device_problems([run], {**env, 'XLA_FLAGS': ''}) == ([], [])  # 1 device


@pytest.mark.parametrize(
  'n, batch, devices, size',
  [
    (360, 4096, 8, 360),
    (360, 256, 8, 184),
    (19962, 4096, 8, 4000),
    (7, 4096, 8, 8),
    (4096, 4096, 8, 4096),
    (4097, 4096, 8, 2056),
  ],
)
def test_no_evaluation_batch_is_padded_past_the_test_set(n, batch, devices, size):
  """Case 13: 360 test images were evaluated in one batch of eval_batch_size (4096: 3736 copies of
  image 0; 4194304: RESOURCE_EXHAUSTED at the first evaluation, after an epoch of training)."""
  assert batching.eval_batch_size(n, batch, devices) == size
  split = input_pipeline.Split(np.zeros((n, 1, 1, 1), np.uint8), np.arange(n))
  masks = [b['mask'] for b in batching.eval_batches(split, size)]
  assert {len(m) for m in masks} == {size} and sum(m.sum() for m in masks) == n
  assert len(masks) * size - n < devices * len(masks)  # padding: under one per device a batch


def test_a_resume_onto_another_platform_identity_is_refused_or_a_platform_of_its_own(
  tmp_path, subprocess_env, monkeypatch
):
  """Case 5: a run resumed under XLA_FLAGS=--xla_cpu_max_isa=<lower> was accepted and labelled,
  all of it, with the new platform identity. Now train.py refuses it in one line (checkpoints
  unchanged); with --allow_layout_change the run continues, its segments say where each part
  ran, and the analysis names it a platform of its own. The run keeps its run_id throughout."""
  workdir = tmp_path / 'run'
  done = train.train_and_evaluate(smoke_config(), str(workdir))
  shutil.rmtree(workdir / 'checkpoints' / str(done['step']))  # as if stopped before the end
  before = tree_hash(workdir / 'checkpoints')
  start = record.read_results(str(workdir))
  own = rules.platform_identity(start)
  assert own.startswith('cpu-') and '-max-' not in own and start['run_id'] == done['run_id']
  pinned = {
    **subprocess_env,
    'XLA_FLAGS': subprocess_env.get('XLA_FLAGS', '') + ' --xla_cpu_max_isa=SSE4_2',
  }
  proc = run_train(
    [
      '--config=configs/digits.py:smoke',
      '--config.checkpoint_every_steps=4',
      f'--workdir={workdir}',
    ],
    pinned,
    timeout=300,
  )
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert (
    last.startswith(f'error: workdir {workdir} holds a run saved at step ')
    and (
      f'on another platform identity (platform identity: {own} -> {own}-max-SSE4_2; the analysis '
      'groups runs by it)'
    )
    in last
  )
  assert tree_hash(workdir / 'checkpoints') == before
  monkeypatch.setenv('XLA_FLAGS', pinned['XLA_FLAGS'])  # what execution.facts() reads
  final = train.train_and_evaluate(smoke_config(), str(workdir), allow_layout_change=True)
  assert final['status'] == 'completed' and final['run_id'] == done['run_id']
  assert [s['xla_cpu_isa'] for s in final['segments']] == [start['xla_cpu_isa'], 'SSE4_2']
  row = inputs.load_runs(str(workdir)).iloc[0]
  assert row['platform'] == f'{own}+{own}-max-SSE4_2' and row['run_id'] == done['run_id']
