"""ResNet-18: torchvision's parameter count, output shapes, dtypes, BatchNorm semantics."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import digits
from models import layers, resnet


def test_parameter_count_matches_torchvision():
  model = nnx.eval_shape(lambda: resnet.ResNet18(1000, rngs=nnx.Rngs(0)))
  assert resnet.count_params(model) == 11_689_512


def test_parameter_paths_follow_torchvision_names():
  model = nnx.eval_shape(lambda: resnet.ResNet18(10, rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param).to_pure_dict()
  assert set(params) == {'conv1', 'bn1', 'layer1', 'layer2', 'layer3', 'layer4', 'fc'}
  assert params['layer2'][0]['downsample'][0]['kernel'].shape == (1, 1, 64, 128)
  assert params['conv1']['kernel'].shape == (7, 7, 3, 64)
  assert params['fc']['kernel'].shape == (512, 10)
  assert 'downsample' not in params['layer1'][0] or params['layer1'][0]['downsample'] is None


def test_output_shapes_for_both_stems():
  big = resnet.ResNet18(7, width=0.125, rngs=nnx.Rngs(0))
  assert big(jnp.zeros((2, 64, 64, 3))).shape == (2, 7)
  small = resnet.ResNet18(5, in_channels=1, width=0.125, stem='small', rngs=nnx.Rngs(0))
  out = small(jnp.zeros((3, 8, 8, 1)))
  assert out.shape == (3, 5) and out.dtype == jnp.float32


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model = resnet.ResNet18(
    4, in_channels=1, width=0.125, stem='small', dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
  )
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert model(jnp.ones((2, 8, 8, 1))).dtype == jnp.float32


def test_create_model_from_config():
  config = digits.get_config('smoke')
  model = resnet.create_model(config, 10, 1, nnx.Rngs(0))
  assert model.conv1.kernel.shape == (3, 3, 1, 8)  # small stem, width 0.125


def test_batchnorm_matches_torch_semantics():
  x = np.random.default_rng(0).normal(2.0, 3.0, (4, 5, 5, 3)).astype(np.float32)
  bn = layers.BatchNorm(3)
  y = np.asarray(bn(jnp.asarray(x)))
  mean, var = x.mean((0, 1, 2)), x.var((0, 1, 2))
  np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
  n = x.size // 3
  np.testing.assert_allclose(np.asarray(bn.mean[...]), 0.1 * mean, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(bn.var[...]), 0.9 + 0.1 * var * n / (n - 1), rtol=1e-5)
  bn.use_running_average = True
  y_eval = np.asarray(bn(jnp.asarray(x)))
  expected = (x - 0.1 * mean) / np.sqrt(0.9 + 0.1 * var * n / (n - 1) + 1e-5)
  np.testing.assert_allclose(y_eval, expected, rtol=1e-4, atol=1e-5)
