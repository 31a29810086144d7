"""ResNet-18 and ResNet-50: torchvision's parameter counts and names, output shapes, dtypes,
BatchNorm semantics; the model registry."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import models
from configs import digits
from models import layers, resnet


def test_parameter_count_matches_torchvision():
  model = nnx.eval_shape(lambda: resnet.ResNet18(1000, rngs=nnx.Rngs(0)))
  assert layers.count_params(model) == 11_689_512
  model = nnx.eval_shape(lambda: resnet.ResNet50(1000, rngs=nnx.Rngs(0)))
  assert layers.count_params(model) == 25_557_032


def test_resnet50_follows_torchvision_bottlenecks():
  """Bottleneck (V1.5: the stride on the 3x3 conv), expansion 4, 1x1 conv + BN downsample."""
  model = nnx.eval_shape(lambda: resnet.ResNet50(10, rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param).to_pure_dict()
  block = params['layer2'][0]
  assert block['conv1']['kernel'].shape == (1, 1, 256, 128)
  assert block['conv2']['kernel'].shape == (3, 3, 128, 128) and model.layer2[0].conv2.stride == 2
  assert block['conv3']['kernel'].shape == (1, 1, 128, 512) and model.layer2[0].conv1.stride == 1
  assert block['downsample'][0]['kernel'].shape == (1, 1, 256, 512)
  assert model.layer1[0].downsample is not None and model.layer1[1].downsample is None
  assert [len(s) for s in (model.layer1, model.layer2, model.layer3, model.layer4)] == [3, 4, 6, 3]
  assert params['fc']['kernel'].shape == (2048, 10)
  keys = layers.torch_keys(model)
  assert len(keys) == 267 and 'layer4.2.bn3.running_var' in keys  # 320 less num_batches_tracked


def test_the_registry_finds_modules_by_name_without_importing_them():
  assert models.missing('resnet50') is None and models.missing('resnet18') is None
  assert models.module_name('my_models.tiny') == 'my_models.tiny'
  assert models.missing('resnet999').startswith("config.model.name='resnet999': no model module")
  assert models.missing('no_package.tiny').startswith("config.model.name='no_package.tiny'")
  assert 'not a module name' in models.missing('resnet-50')
  config = digits.get_config('smoke')
  config.model.name = 'resnet50'
  assert models.build(config, 10, 1, nnx.Rngs(0)).layer4[0].conv3.kernel.shape == (1, 1, 64, 256)


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
  model = models.build(config, 10, 1, nnx.Rngs(0))
  assert model.conv1.kernel.shape == (3, 3, 1, 8)  # small stem, width 0.125


def test_batchnorm_matches_torch_semantics():
  x = np.random.default_rng(0).normal(2.0, 3.0, (4, 5, 5, 3)).astype(np.float32)
  bn = layers.BatchNorm(3)
  y = np.asarray(bn(jnp.asarray(x)))
  mean, var = x.mean((0, 1, 2)), x.var((0, 1, 2))
  n = x.size // 3
  # numpy (pairwise) and XLA sum the n = 100 values of a channel in f32 in other orders, each
  # within n u sum|terms| (u = 2^-24, tests/support/floats.py): the means differ by at most
  # d_mean = 2 n u mean|x|, the variances by a relative 2 (n + 5) u (the centred squares add one
  # rounding each, the mean's error enters squared). y = (x - mean) / sqrt(var + eps) then differs
  # by d_mean / sd plus a relative (n + 13) u (half the variance's, the subtraction, rsqrt and
  # product on each side). Was rtol 1e-4 + atol 1e-5 for y (below d_mean / sd = 1.2e-5 here),
  # rtol 1e-5 for the running mean (below d_mean / |mean| = 2e-5 here).
  u = 2.0**-24
  d_mean = 2 * n * u * np.abs(x).mean((0, 1, 2))
  atol_y, rtol_y = float(np.max(d_mean / np.sqrt(var))), (n + 13) * u
  np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5), rtol=rtol_y, atol=atol_y)
  np.testing.assert_allclose(
    np.asarray(bn.mean[...]), 0.1 * mean, rtol=u, atol=float(np.max(0.1 * d_mean))
  )
  np.testing.assert_allclose(
    np.asarray(bn.var[...]), 0.9 + 0.1 * var * n / (n - 1), rtol=2 * (n + 8) * u
  )
  bn.use_running_average = True
  y_eval = np.asarray(bn(jnp.asarray(x)))
  expected = (x - 0.1 * mean) / np.sqrt(0.9 + 0.1 * var * n / (n - 1) + 1e-5)
  # The running statistics' differences (above) through one normalisation: the running mean's
  # 0.1 d_mean over sqrt(running var) (~1.3), the running variance's relative error halved.
  np.testing.assert_allclose(y_eval, expected, rtol=(n + 13) * u, atol=float(np.max(0.1 * d_mean)))


def test_a_traced_batchnorm_update_equals_flaxs_and_builds_no_error_message(monkeypatch):
  """Under jit the running statistics are those flax's own `variable[...] = value` gives, bit for
  bit, and tracing them asks no tracer for its sharding (JAX answers with an error message that
  scans the whole trace)."""
  x = jnp.asarray(np.random.default_rng(1).normal(1.0, 2.0, (8, 3, 3, 4)).astype(np.float32))

  def trained():  # a new jitted function each time: each call traces
    bn = layers.BatchNorm(4)
    nnx.jit(lambda bn, x: bn(x))(bn, x)
    return [np.asarray(v[...]) for v in (bn.mean, bn.var)]

  asked = []
  sharding = jnp.zeros(()).sharding
  monkeypatch.setattr(jax.core.Tracer, 'sharding', property(lambda t: asked.append(t) or sharding))
  with monkeypatch.context() as m:
    m.setattr(layers, 'assign', lambda variable, value: variable.__setitem__(..., value))
    reference = trained()
  assert asked  # flax's own assignment asks
  asked.clear()
  stats = trained()
  assert asked == []
  for a, b in zip(reference, stats, strict=True):
    assert a.dtype == b.dtype == np.float32 and np.array_equal(a, b)
