"""conv_impl='im2col' computes the same convolution as lax's, forward and backward, in every format.

The two differ only in the order of the f32 summation, so they agree to float tolerance (not bit for
bit). Shapes: every convolution of ResNet-18 at 64^2 (channels scaled by 1/8 to keep the test
fast; the spatial sizes, kernels, strides and paddings are the real ones), NHWC x HWIO.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import digits
from models import resnet
from numerics import ops
from numerics import setup as numerics_setup

# (name, input size, in channels, out channels, kernel, stride, padding)
RESNET18_CONVS = [
    ('stem 7x7/2', 64, 3, 8, 7, 2, 3),
    ('small stem 3x3/1', 16, 1, 8, 3, 1, 1),
    ('layer1 3x3/1', 16, 8, 8, 3, 1, 1),
    ('layer2.0.conv1 3x3/2', 16, 8, 16, 3, 2, 1),
    ('layer2.0.downsample 1x1/2', 16, 8, 16, 1, 2, 0),
    ('layer2 3x3/1', 8, 16, 16, 3, 1, 1),
    ('layer3.0.conv1 3x3/2', 8, 16, 32, 3, 2, 1),
    ('layer3.0.downsample 1x1/2', 8, 16, 32, 1, 2, 0),
    ('layer4.0.conv1 3x3/2', 4, 32, 64, 3, 2, 1),
    ('layer4.0.downsample 1x1/2', 4, 32, 64, 1, 2, 0),
    ('layer4 3x3/1 on 2x2', 2, 64, 64, 3, 1, 1),
]
IDS = [c[0] for c in RESNET18_CONVS]


def _operands(size, cin, cout, k, seed=0, batch=2):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(batch, size, size, cin)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(k, k, cin, cout)) / np.sqrt(k * k * cin), jnp.float32)
  return x, w


def _value_and_grads(impl, x, w, stride, padding, emulate='none'):
  """conv output and d<cos(y), 1>/dx, /dw: a non-trivial cotangent for both gradients."""
  def f(x, w):
    y = ops.conv2d(x, w, stride, padding, emulate=emulate, impl=impl)
    return jnp.sum(jnp.cos(y.astype(jnp.float32))), y
  (_, y), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(x, w)
  return y, grads


def _close(a, b, rtol):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(np.max(np.abs(b)), 1e-30)
  np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize('shape', RESNET18_CONVS, ids=IDS)
def test_im2col_equals_lax_conv_values_and_gradients(shape):
  _, size, cin, cout, k, stride, pad = shape
  x, w = _operands(size, cin, cout, k)
  padding = [(pad, pad)] * 2
  y_ref, (dx_ref, dw_ref) = _value_and_grads('xla', x, w, stride, padding)
  y, (dx, dw) = _value_and_grads('im2col', x, w, stride, padding)
  assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
  assert dx.shape == x.shape and dw.shape == w.shape
  _close(y, y_ref, 1e-5)
  _close(dx, dx_ref, 1e-5)
  _close(dw, dw_ref, 1e-5)


@pytest.mark.parametrize('emulate', ['bf16', 'bf16_3x', 'tf32', 'f32'])
@pytest.mark.parametrize('shape', [RESNET18_CONVS[3], RESNET18_CONVS[4], RESNET18_CONVS[10]],
                         ids=[IDS[3], IDS[4], IDS[10]])
def test_im2col_with_emulated_formats(shape, emulate):
  """Same operand rounding as lax's conv under every emulate mode, forward and backward."""
  _, size, cin, cout, k, stride, pad = shape
  x, w = _operands(size, cin, cout, k, seed=1)
  padding = [(pad, pad)] * 2
  y_ref, (dx_ref, dw_ref) = _value_and_grads('xla', x, w, stride, padding, emulate)
  y, (dx, dw) = _value_and_grads('im2col', x, w, stride, padding, emulate)
  _close(y, y_ref, 1e-5)
  _close(dx, dx_ref, 1e-5)
  _close(dw, dw_ref, 1e-5)
  if emulate == 'bf16':  # and the rounding really happened: far from the f32 product
    y_f32, _ = _value_and_grads('im2col', x, w, stride, padding)
    assert float(jnp.max(jnp.abs(y - y_f32))) > 1e-4


def test_im2col_bfloat16_operands():
  """bf16 operands: f32 accumulation, one rounding to bf16; gradients in bf16 like lax's."""
  _, size, cin, cout, k, stride, pad = RESNET18_CONVS[3]
  x, w = _operands(size, cin, cout, k, seed=2)
  x, w = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  padding = [(pad, pad)] * 2
  y_ref, (dx_ref, dw_ref) = _value_and_grads('xla', x, w, stride, padding)
  y, (dx, dw) = _value_and_grads('im2col', x, w, stride, padding)
  assert y.dtype == y_ref.dtype == jnp.bfloat16
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  _close(y, y_ref, 2 ** -7)
  _close(dx, dx_ref, 2 ** -6)
  _close(dw, dw_ref, 2 ** -6)


@pytest.mark.parametrize('padding', ['SAME', 'VALID'])
def test_im2col_string_padding(padding):
  x, w = _operands(7, 4, 6, 3, seed=3)
  for stride in (1, 2):
    ref = ops.conv2d(x, w, stride, padding, impl='xla')
    _close(ops.conv2d(x, w, stride, padding, impl='im2col'), ref, 1e-5)


def test_resolve_conv_impl():
  assert ops.resolve_conv_impl('auto', 'cpu') == 'im2col'
  assert ops.resolve_conv_impl('auto', 'gpu') == 'xla'
  assert ops.resolve_conv_impl('auto', 'tpu') == 'xla'
  assert ops.resolve_conv_impl('im2col', 'gpu') == 'im2col'
  assert ops.resolve_conv_impl('xla', 'cpu') == 'xla'
  # 'auto' on CPU: im2col only where the convolution is big enough to be worth it.
  assert ops.resolve_conv_impl('auto', 'cpu', macs=ops.IM2COL_MIN_MACS) == 'im2col'
  assert ops.resolve_conv_impl('auto', 'cpu', macs=ops.IM2COL_MIN_MACS - 1) == 'xla'
  assert ops.resolve_conv_impl('auto', 'gpu', macs=10**12) == 'xla'
  assert ops.conv_macs((2, 16, 16, 64), (3, 3, 64, 128), 2) == 8 * 8 * 9 * 64 * 128
  with pytest.raises(ValueError, match='config.numerics.conv_impl'):
    ops.resolve_conv_impl('cudnn')


def test_config_validation_and_record():
  config = digits.get_config('smoke')
  assert config.numerics.conv_impl == 'auto'
  effective = numerics_setup.describe(config)['effective']
  assert effective['conv_impl'].startswith('im2col (convs of >= ') and effective['conv_format'] == 'f32'  # CPU
  config.numerics.conv_impl = 'im2col'
  assert numerics_setup.describe(config)['effective']['conv_impl'] == 'im2col'
  config.numerics.conv_impl = 'xla'
  assert numerics_setup.describe(config)['effective']['conv_impl'] == 'xla'
  config.numerics.conv_impl = 'winograd'
  with pytest.raises(ValueError, match='config.numerics.conv_impl'):
    numerics_setup.validate(config)


def test_model_logits_and_gradients_agree_across_impls():
  """The whole ResNet-18 (both stems' convs, every stage) trains the same under both impls."""
  config = digits.get_config('smoke')
  config.model.stem = 'imagenet'
  x = jnp.asarray(np.random.default_rng(4).normal(size=(4, 32, 32, 1)), jnp.float32)
  labels = jnp.arange(4) % 10
  results = {}
  for impl in ('xla', 'im2col'):
    config.numerics.conv_impl = impl
    model = resnet.create_model(config, 10, 1, nnx.Rngs(0))
    assert model.layer2[0].downsample[0].conv_impl == impl
    graphdef = nnx.graphdef(model)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    rest = nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))

    def loss(params, rest, graphdef=graphdef):
      m = nnx.merge(graphdef, params, rest)
      logits = m(x)
      return jnp.mean(-jax.nn.log_softmax(logits)[jnp.arange(4), labels]), logits
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, rest)
    results[impl] = (logits, grads)
  _close(results['im2col'][0], results['xla'][0], 1e-4)
  for a, b in zip(jax.tree.leaves(results['im2col'][1]), jax.tree.leaves(results['xla'][1])):
    _close(a, b, 1e-3)
