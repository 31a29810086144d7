"""The run's identity at resume: its data (files, split, resolution, classes) and device layout."""

import shutil
import signal

import numpy as np
import pytest

from configs import celeba as celeba_config
from configs import validation
from input_pipeline import celeba_fixture
from runrecord import record, rules
from tests.conftest import cpu_xla_flags
from tests.support.faults_common import SMOKE_ARGS, last_line, run_train, saved_steps, tree_hash
from trainer import train


def _celeba(manual_dir):
  config = celeba_config.get_config('smoke')
  config.data.manual_dir = str(manual_dir)
  return validation.resolve(config)


@pytest.mark.timeout(600)
def test_resume_on_other_celeba_files_is_refused_naming_the_data(tmp_path):
  """An unfinished run on fixture A, resumed with data.manual_dir pointing at other files of the
  same class count (B) or of another class count (C): refused before compute with one line naming
  what differs, not called damaged, not told to --restart; the checkpoints are unchanged."""
  a, b, c = (tmp_path / name for name in 'abc')
  celeba_fixture.generate(str(a), identities=16, max_images=9, seed=3)
  celeba_fixture.generate(str(b), identities=16, max_images=9, seed=4)
  celeba_fixture.generate(str(c), identities=12, max_images=9, seed=3)
  workdir = tmp_path / 'run'
  done = train.train_and_evaluate(_celeba(a), str(workdir))
  saved = record.read_predictions(str(workdir))  # the CelebA run's, in test-set order
  assert saved['step'] == done['step'] and saved['task'] == 'classification'
  assert saved['fingerprint'] == done['data']['split_fingerprint']
  assert saved['predicted'].shape == (done['data']['test_size'],)
  shutil.rmtree(workdir / 'checkpoints' / str(done['step']))  # as if stopped before the end
  before = tree_hash(workdir / 'checkpoints')
  with pytest.raises(validation.ConfigError) as same_classes:
    train.train_and_evaluate(_celeba(b), str(workdir))
  with pytest.raises(validation.ConfigError) as other_classes:
    train.train_and_evaluate(_celeba(c), str(workdir))
  for error in (same_classes, other_classes):
    message = str(error.value)
    assert 'holds a run trained on other data (data.source_fingerprint: ' in message
    assert (
      'point config.data (manual_dir, tfds_dir, cache_dir) at the data it was trained on' in message
    )
    assert 'damaged' not in message and '--restart' not in message and '\n' not in message
  assert 'data.num_classes' not in str(same_classes.value)
  assert 'data.num_classes: 16 -> 12' in str(other_classes.value)
  assert tree_hash(workdir / 'checkpoints') == before
  assert train.train_and_evaluate(_celeba(a), str(workdir))['final'] == done['final']
  resumed = record.read_predictions(str(workdir))
  assert all(np.array_equal(resumed[k], saved[k]) for k in record.PREDICTION_KEYS['classification'])


@pytest.mark.timeout(600)
def test_resume_on_other_device_count_needs_opt_in_and_records_segments(tmp_path, subprocess_env):
  """Stopped at step 7 (epoch 2) on 8 devices, resumed on 4: refused with one line (exit 2,
  checkpoints unchanged); with --allow_layout_change it completes and the results record both
  segments. Batch 256: 5 steps an epoch, 10 in all (the layout check does not depend on them)."""
  workdir = tmp_path / 'w'
  args = SMOKE_ARGS + ['--config.batch_size=256', f'--workdir={workdir}']
  proc = run_train(args, subprocess_env, fault='term@step:7')
  assert proc.returncode == 128 + signal.SIGTERM and 7 in saved_steps(workdir), proc.stderr[-3000:]
  four = dict(subprocess_env)
  four['XLA_FLAGS'] = cpu_xla_flags(4)
  before = tree_hash(workdir / 'checkpoints')
  proc = run_train(args, four)
  last, only_logs = last_line(proc.stderr)
  assert proc.returncode == 2 and only_logs, proc.stderr[-3000:]
  assert last == (
    f'error: workdir {workdir} holds a run saved at step 7 on another device layout '
    '(num_devices: 8 -> 4): resume it on the same devices and processes, or pass '
    '--allow_layout_change to continue on these (the results then record each '
    'segment)'
  )
  assert tree_hash(workdir / 'checkpoints') == before
  proc = run_train(args + ['--allow_layout_change'], four)
  assert proc.returncode == 0, proc.stderr[-3000:]
  final = record.read_results(str(workdir))
  layout = {
    'platform': 'cpu',
    'device_kind': final['device_kind'],
    'num_processes': 1,
    **{k: final[k] for k in record.CPU_FACTS},
  }  # each segment's processor too
  assert final['segments'] == [
    {'start_step': 0, 'stop_step': 7, **layout, 'num_devices': 8},
    {'start_step': 7, 'stop_step': 10, **layout, 'num_devices': 4},
  ]
  assert final['status'] == 'completed' and final['num_devices'] == 4


def test_segments_merge_on_one_layout_and_start_from_an_old_record():
  eight = {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 8, 'num_processes': 1}
  four = dict(eight, num_devices=4)
  results = {}
  rules.start_segment(results, None, eight, 0)
  rules.end_segment(results, 12)
  assert results['segments'] == [{'start_step': 0, 'stop_step': 12, **eight}]
  saved = dict(results)
  rules.start_segment(results, saved, eight, 12)  # resumed on the same layout: one segment
  assert results['segments'] == [{'start_step': 0, 'stop_step': 12, **eight}]
  rules.start_segment(results, saved, four, 8)  # an older checkpoint, another layout
  assert results['segments'] == [
    {'start_step': 0, 'stop_step': 8, **eight},
    {'start_step': 8, 'stop_step': 8, **four},
  ]
  old = dict(eight, step=20)  # a record written before segments existed
  rules.start_segment(results, old, four, 20)
  assert results['segments'] == [
    {'start_step': 0, 'stop_step': 20, **eight},
    {'start_step': 20, 'stop_step': 20, **four},
  ]
  assert rules.layout_differences(old, four) == ['num_devices: 8 -> 4']
