"""Schedule values, phases, and the frozen-backbone step (backbone bit-identical, head moving)."""

import jax
import numpy as np
import pytest
from flax import nnx

import models
from configs import digits
from models import resnet
from trainer import run, train


def _config(**overrides):
  c = digits.get_config('smoke')
  for key, value in overrides.items():
    node, leaf = (c.optim, key) if key in c.optim else (c, key)
    node[leaf] = value
  return c


def test_per_phase_schedule_restarts_at_unfreeze():
  c = _config(num_epochs=5, freeze_epochs=2, warmup_epochs=1.0, learning_rate=0.01)
  per_epoch = 10
  p = run.phases(c, per_epoch)
  assert [(x.start, x.stop, x.frozen) for x in p] == [(0, 20, True), (20, 50, False)]

  def lr(s):
    return run.learning_rate(c, per_epoch, p, s)

  assert lr(0) == 0.0
  assert lr(10) == pytest.approx(0.01)  # end of warmup: the peak
  assert lr(19) == pytest.approx(0.01 * 0.5 * (1 + np.cos(np.pi * 9 / 10)), rel=1e-5)
  assert lr(20) == 0.0  # a fresh warmup at unfreeze
  assert lr(30) == pytest.approx(0.01)
  assert lr(49) == pytest.approx(0.01 * 0.5 * (1 + np.cos(np.pi * 19 / 20)), rel=1e-5)


def test_continuous_schedule_spans_all_epochs():
  c = _config(
    num_epochs=5, freeze_epochs=2, warmup_epochs=1.0, learning_rate=0.01, schedule='continuous'
  )
  p = run.phases(c, 10)
  assert [(x.start, x.stop, x.schedule_start, x.schedule_length) for x in p] == [
    (0, 20, 0, 50),
    (20, 50, 0, 50),
  ]

  def lr(s):
    return run.learning_rate(c, 10, p, s)

  assert lr(10) == pytest.approx(0.01)
  assert lr(20) == pytest.approx(0.01 * 0.5 * (1 + np.cos(np.pi * 10 / 40)), rel=1e-5)
  assert lr(50) == pytest.approx(0.0, abs=1e-9)  # decay end


def test_no_freeze_gives_one_phase():
  p = run.phases(_config(num_epochs=3, freeze_epochs=0), 7)
  assert [(x.start, x.stop, x.frozen) for x in p] == [(0, 21, False)]


def _train_tiny(config, frozen, num_steps, seed):
  """(params before, batch stats before, state after, mask): `num_steps` steps on random batches."""
  model = models.build(config, 10, 1, nnx.Rngs(0))
  tx = run.make_optimizer(config, 3, run.phases(config, 3)[0])
  state = train.create_train_state(model, tx)
  before = jax.tree.map(np.asarray, state['params'])
  stats_before = jax.tree.map(np.asarray, state['batch_stats'])
  mask = run.trainable_mask(state['params'], frozen, config.model.reinit, resnet.PARTS)
  mesh = run.make_mesh(jax.devices()[:1])
  step = train.make_train_step(
    mesh, nnx.graphdef(model), tx, mask, 'classification', np.zeros(1), np.ones(1), False, 0
  )
  rng = np.random.default_rng(seed)
  for _ in range(num_steps):
    batch = {
      'image': rng.integers(0, 255, (8, 8, 8, 1), dtype=np.uint8),
      'label': rng.integers(0, 10, (8,)).astype(np.int32),
    }
    state = step(state, batch)
  return before, stats_before, state, mask


def test_frozen_phase_keeps_backbone_bit_identical_and_trains_stem_and_head():
  config = _config(num_epochs=2, freeze_epochs=1)
  before, stats_before, state, _ = _train_tiny(config, frozen=True, num_steps=3, seed=0)
  after = jax.tree.map(np.asarray, state['params'])
  for name in ('layer1', 'layer2', 'layer3', 'layer4'):
    jax.tree.map(np.testing.assert_array_equal, after[name], before[name])
  for name in ('conv1', 'bn1', 'fc'):
    assert any(
      not np.array_equal(a, b)
      for a, b in zip(jax.tree.leaves(after[name]), jax.tree.leaves(before[name]), strict=True)
    ), name
  # BatchNorm stays in train mode while frozen: the backbone's running statistics move.
  assert not np.array_equal(
    np.asarray(state['batch_stats']['layer3'][0]['bn1']['mean']),
    stats_before['layer3'][0]['bn1']['mean'],
  )
  assert int(state['step']) == 3


def test_unfrozen_phase_trains_everything():
  config = _config(num_epochs=2, freeze_epochs=0)
  # Two steps: the first step's lr is 0 (warmup starts at 0).
  before, _, state, mask = _train_tiny(config, frozen=False, num_steps=2, seed=1)
  assert all(jax.tree.leaves(mask))
  assert not np.array_equal(
    np.asarray(state['params']['layer4'][1]['conv2']['kernel']),
    before['layer4'][1]['conv2']['kernel'],
  )
