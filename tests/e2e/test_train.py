"""End to end on the embedded default: train, checkpoint, resume, results, metrics."""

import json
import shutil

import jax
import numpy as np
import pytest

from configs import common, digits, validation
from runrecord import record
from trainer import checkpoint, train

RESULT_KEYS = {
  'status',
  'seed',
  'platform',
  'device_kind',
  'num_devices',
  'num_processes',
  'numerics',
  'final',
  'history',
  'config',
  'versions',
  'wall_time_s',
}


def smoke_config(**overrides):
  """The smoke run's resolved config, with `overrides` ({dotted field: value}) applied first."""
  c = digits.get_config('smoke')
  c.log_every_steps = 4
  return validation.resolve(common.apply_overrides(c, overrides.items()))


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('run') / 'w'
  results = train.train_and_evaluate(smoke_config(), str(workdir))
  return workdir, results


def test_results_hold_every_required_field(finished_run):
  workdir, results = finished_run
  assert RESULT_KEYS <= set(results)
  assert results['status'] == 'completed'
  assert results['platform'] == 'cpu' and results['num_devices'] == jax.device_count()
  assert set(results['final']) >= {'test_accuracy', 'test_loss', 'train_loss'}
  assert [h['epoch'] for h in results['history']] == [1, 2]
  assert results['history'][-1]['test_accuracy'] == results['final']['test_accuracy']
  assert set(results['versions']) >= {'jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint'}
  assert results['numerics']['requested']['matmul_precision'] == 'default'
  assert results['config']['seed'] == 0 and results['data']['test_size'] == 360
  # Learns something even in the smoke preset (chance is 0.1).
  assert results['final']['test_accuracy'] > 0.3


def test_results_item_is_readable_from_orbax(finished_run):
  workdir, results = finished_run
  mngr = checkpoint.manager(str(workdir), 3)
  saved = checkpoint.restore_results(mngr, mngr.latest_step())
  assert saved['final'] == results['final'] and saved['status'] == 'completed'
  assert mngr.all_steps() == [22, 44]


def test_metrics_file_has_train_and_epoch_records(finished_run):
  workdir, _ = finished_run
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  kinds = {r['kind'] for r in records}
  assert kinds == {'train', 'epoch'}
  train_steps = [r['step'] for r in records if r['kind'] == 'train']
  assert train_steps == sorted(train_steps) and train_steps[-1] == 44
  assert all(np.isfinite(r['train_loss']) for r in records)
  assert any(p.name.startswith('events') for p in (workdir / 'tensorboard').iterdir())


def test_interrupted_run_resumes_at_its_step_and_ends_bit_identical(finished_run, tmp_path):
  workdir, results = finished_run
  resumed = tmp_path / 'resumed'
  shutil.copytree(workdir, resumed)
  shutil.rmtree(resumed / 'checkpoints' / '44')  # as if killed during the second epoch
  again = train.train_and_evaluate(smoke_config(), str(resumed))
  assert [h['epoch'] for h in again['history']] == [1, 2]
  assert again['final'] == results['final']
  assert again['history'][0] == results['history'][0]  # restored, not recomputed
  # The final evaluation's predictions, recomputed after the resume: bit for bit the same.
  before, after = (record.read_predictions(str(w), 44) for w in (workdir, resumed))
  assert after['step'] == 44 and set(after) == set(before)
  assert all(np.array_equal(after[k], before[k]) for k in record.PREDICTION_KEYS['classification'])
  records = [json.loads(line) for line in (resumed / 'metrics.jsonl').read_text().splitlines()]
  steps = [r['step'] for r in records if r['kind'] == 'train']
  assert len(steps) == len(set(steps))  # no duplicated records after the resume


def test_completed_run_is_not_trained_again(finished_run):
  workdir, results = finished_run
  again = train.train_and_evaluate(smoke_config(), str(workdir))
  assert again['final'] == results['final'] and again['wall_time_s'] == results['wall_time_s']


def test_device_resident_dataset_trains_bit_identically(finished_run, tmp_path):
  """data.on_device gathers the same rows on the devices: every logged number is unchanged."""
  _, results = finished_run
  config = smoke_config(**{'data.on_device': True})
  workdir = tmp_path / 'on_device'
  again = train.train_and_evaluate(config, str(workdir))

  def strip(history):
    return [{k: v for k, v in h.items() if k != 'wall_time_s'} for h in history]

  assert strip(again['history']) == strip(results['history'])
  assert again['final'] == results['final']
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  losses = [r['train_loss'] for r in records if r['kind'] == 'train']
  expected = [
    json.loads(line) for line in (finished_run[0] / 'metrics.jsonl').read_text().splitlines()
  ]
  assert losses == [r['train_loss'] for r in expected if r['kind'] == 'train']
