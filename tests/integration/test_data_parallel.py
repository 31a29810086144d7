"""Data parallel over 8 (virtual CPU) devices gives the 1-device result for the same global
batch."""

import jax
import numpy as np
from flax import nnx

import models
from configs import digits
from models import resnet
from trainer import run, train


def _run(devices, batches, config):
  model = models.build(config, 10, 1, nnx.Rngs(0))
  phase = run.phases(config, 4)[0]
  tx = run.make_optimizer(config, 4, phase)
  mesh = run.make_mesh(devices)
  replicated, sharded = run.shardings(mesh)
  state = jax.device_put(train.create_train_state(model, tx), replicated)
  mask = run.trainable_mask(state['params'], False, config.model.reinit, resnet.PARTS)
  step = train.make_train_step(
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
  two = _run(jax.devices()[:2], batches, config)
  assert one['sums']['correct'] == eight['sums']['correct']
  # Not bit-exact: the layout changes the order of the cross-device sums (gradients, BatchNorm
  # statistics, the loss), and three optimizer steps carry those last bits on; no bound of the
  # arithmetic alone covers them (an Adam-like update scales any difference of a near-zero
  # gradient). As in tests/e2e/test_multihost.py order_tolerance, the bound is measured on this
  # host: 4 x what the layout change 1 -> 2 devices makes, at least 4 ulps. Measured here:
  # params 6.1e-7 (1 vs 2) and 5.1e-7 (1 vs 8), batch_stats 3.6e-7 and 2.4e-7, loss sums 1 ulp
  # and equal (was rtol 1e-4 + atol 1e-6 per value: 1e-4 at values near 1).
  loss, loss_two = one['sums']['loss'], two['sums']['loss']
  rel = max(4 * abs(loss - loss_two) / abs(loss), 4 * 2.0**-23)
  assert abs(eight['sums']['loss'] - loss) <= rel * abs(loss)
  for name in ('params', 'batch_stats'):
    leaves = [jax.tree.leaves(r[name]) for r in (one, two, eight)]
    tolerance = max(4 * max_diff(leaves[0], leaves[1]), 4 * 2.0**-23 * max_abs(leaves[0]))
    assert max_diff(leaves[0], leaves[2]) <= tolerance, name


def max_diff(xs, ys):
  return max(
    float(np.max(np.abs(np.float64(x) - np.float64(y)))) for x, y in zip(xs, ys, strict=True)
  )


def max_abs(xs):
  return max(float(np.max(np.abs(x))) for x in xs)
