"""Data parallel over 8 (virtual CPU) devices gives the 1-device result for the same global
batch."""

import jax
import numpy as np
from flax import nnx

from configs import digits
from models import resnet
from trainer import optim, steps


def _run(devices, batches, config):
  model = resnet.create_model(config, 10, 1, nnx.Rngs(0))
  phase = optim.phases(config, 4)[0]
  tx = optim.make_optimizer(config, 4, phase)
  mesh = steps.make_mesh(devices)
  replicated, sharded = steps.shardings(mesh)
  state = jax.device_put(steps.init_state(model, tx), replicated)
  mask = optim.trainable_mask(state['params'], False, config.model.reinit)
  step = steps.make_train_step(
    mesh, nnx.graphdef(model), tx, mask, 'classification', np.full(1, 0.5), np.full(1, 0.5), True, 0
  )
  for batch in batches:
    state = step(state, jax.device_put(batch, sharded))
  return jax.device_get(state)


def test_eight_devices_match_one_device():
  assert jax.device_count() == 8
  config = digits.get_config('smoke')
  config.optim.freeze_epochs = 0
  rng = np.random.default_rng(0)
  batches = [
    {
      'image': rng.integers(0, 255, (16, 8, 8, 1), dtype=np.uint8),
      'label': rng.integers(0, 10, (16,)).astype(np.int32),
    }
    for _ in range(3)
  ]
  one = _run(jax.devices()[:1], batches, config)
  eight = _run(jax.devices(), batches, config)
  np.testing.assert_allclose(one['sums']['loss'], eight['sums']['loss'], rtol=1e-5)
  assert one['sums']['correct'] == eight['sums']['correct']
  flat_one, flat_eight = jax.tree.leaves(one['params']), jax.tree.leaves(eight['params'])
  for a, b in zip(flat_one, flat_eight, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  for a, b in zip(
    jax.tree.leaves(one['batch_stats']), jax.tree.leaves(eight['batch_stats']), strict=True
  ):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
