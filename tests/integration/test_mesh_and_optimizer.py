"""Why the data mesh is not jax.make_mesh and the frozen backbone is not optax.multi_transform: the
facts behind the one-line reasons in trainer/run.py `make_mesh` and `masked_update`, checked
against JAX and optax themselves."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType

from configs import digits
from models import resnet
from tests.conftest import ROOT
from trainer import run


def test_on_cpu_jax_make_mesh_gives_the_data_mesh_order():
  mesh = run.make_mesh()
  made = jax.make_mesh((jax.device_count(),), ('data',), (AxisType.Auto,))
  assert jax.device_count() == 8  # conftest's virtual CPU devices
  assert list(mesh.devices.flat) == list(made.devices.flat) == jax.devices()


TPU_ORDER = """
import json, sys
import jax
jax.config.update('jax_platforms', 'cpu')
from jax.sharding import AxisType
from sweeps import tpu
from trainer import run
out = {}
for name in sys.argv[1:]:
  devs = tpu.devices(tpu.parse_topology(name))
  made = jax.make_mesh((len(devs),), ('data',), (AxisType.Auto,), devices=devs)
  out[name] = {'given': [d.id for d in devs],
               'data_mesh': [d.id for d in run.make_mesh(devs).devices.flat],
               'make_mesh': [d.id for d in made.devices.flat],
               'make_mesh_hosts': [d.process_index for d in made.devices.flat]}
print(json.dumps(out))
"""


@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None, reason='libtpu is not installed')
def test_on_tpu_jax_make_mesh_reorders_and_interleaves_hosts():
  """The compile-only devices of sweeps/preflight.py: the data mesh keeps their order; make_mesh
  puts them in a ring, and on a two-host v4 slice alternates the hosts."""
  proc = subprocess.run(
    [sys.executable, '-c', TPU_ORDER, 'v5e:2x2', 'v4:2x2x1', 'v4:2x2x2'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'PYTHONPATH': ROOT},
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  found = json.loads(proc.stdout.strip().splitlines()[-1])
  assert all(v['data_mesh'] == v['given'] for v in found.values())
  assert found['v4:2x2x1']['make_mesh'] == [0, 2, 1, 3]
  assert found['v5e:2x2']['make_mesh'] == [0, 1, 3, 2]
  assert found['v4:2x2x2']['make_mesh_hosts'] == [0, 1] * 4


def _params():
  return {
    'conv1': {'kernel': jnp.ones((3, 3, 1, 4))},
    'layer1': {'kernel': jnp.ones((3, 3, 4, 4))},
    'fc': {'kernel': jnp.ones((4, 10))},
  }


def test_one_optimizer_state_tree_for_both_phases_unlike_multi_transform():
  """The loop restores every checkpoint into the first phase's state (trainer/train.py `_start`):
  the masked update's AdamW has one tree in both phases; multi_transform's changes at the
  unfreeze, so a checkpoint saved after it would not restore."""
  config = digits.get_config('smoke')
  frozen, full = run.phases(config, 3)
  params = _params()

  def tree(tx):
    return jax.tree.structure(tx.init(params))

  assert tree(run.make_optimizer(config, 3, frozen)) == tree(run.make_optimizer(config, 3, full))

  def labelled(is_frozen):
    labels = {
      k: jax.tree.map(lambda _, k=k: 'train' if not is_frozen or k != 'layer1' else 'fix', v)
      for k, v in params.items()
    }
    return optax.multi_transform({'train': optax.adamw(1e-3), 'fix': optax.set_to_zero()}, labels)

  assert tree(labelled(True)) != tree(labelled(False))


def test_masked_update_keeps_frozen_arrays_bit_identical():
  """The frozen parameter is the very array it was (a -0.0 stays -0.0); optax's zero update, as
  set_to_zero gives it, adds +0.0 and flips it."""
  params = {'conv1': {'kernel': jnp.array([-0.0, 1.0])}, 'layer1': {'kernel': jnp.array([-0.0])}}
  grads = jax.tree.map(jnp.ones_like, params)
  tx = optax.adamw(1e-3)
  mask = run.trainable_mask(params, True, ('stem',), resnet.PARTS)
  new, _ = run.masked_update(params, grads, tx.init(params), tx, mask)
  assert new['layer1']['kernel'] is params['layer1']['kernel']
  assert not np.array_equal(new['conv1']['kernel'], params['conv1']['kernel'])  # the stem trains
  zeroed = optax.apply_updates(params['layer1']['kernel'], jnp.zeros(1))
  assert np.signbit(params['layer1']['kernel'][0]) and not np.signbit(zeroed[0])
