"""conv_impl='im2col' computes the same convolution as lax's, forward and backward, in every format.

The two differ only in the order of the f32 summation, so they agree within that order's worst case
(tests/support/floats.py), not bit for bit. Shapes: every convolution of ResNet-18 at 64^2 (channels
scaled by 1/8 to keep the test fast; the spatial sizes, kernels, strides and paddings are the real
ones), NHWC x HWIO.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from benchmarks import bench_conv, bench_step
from benchmarks import common as bench_common
from configs import common, digits, validation
from numerics import ops
from numerics import setup as numerics_setup
from tests.support.floats import assert_within_summation_bound

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


def _cotangent(shape):
  """A fixed cotangent of the output, the same for both impls (a cotangent computed from each
  impl's own output would carry its rounding into the gradients)."""
  return np.random.default_rng(7).normal(size=shape).astype(np.float32)


def _value_and_grads(impl, x, w, stride, padding, fmt='native'):
  """conv output and its vjp at `_cotangent`: y, (dx, dw)."""

  def run(x, w):
    y, vjp = jax.vjp(lambda a, b: ops.conv2d(a, b, stride, padding, fmt=fmt, impl=impl), x, w)
    return y, vjp(jnp.asarray(_cotangent(y.shape), y.dtype))

  return jax.jit(run)(x, w)


def _close(a, b, rtol):
  """max |a - b| <= rtol * max |b|: for what is not a single f32 sum (see each use)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(np.max(np.abs(b)), 1e-30)
  np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


def _same_up_to_order(got, ref, x, w, stride, padding, extra_terms=0):
  """y, dx and dw of the two impls within the worst case of two f32 summation orders
  (tests/support/floats.py): each output a sum of n products, n = k*k*cin for y, at most
  k*k*cout for dx, batch*out_h*out_w for dw; sum |terms| from the absolute operands.
  `extra_terms`: bf16_3x adds 3 products' sums (2 more additions)."""
  k, _, cin, cout = w.shape
  ax, aw = jnp.abs(jnp.asarray(x, jnp.float32)), jnp.abs(jnp.asarray(w, jnp.float32))
  abs_y, vjp = jax.vjp(lambda a, b: ops.conv2d(a, b, stride, padding, impl='xla'), ax, aw)
  abs_dx, abs_dw = vjp(jnp.abs(jnp.asarray(_cotangent(abs_y.shape))))
  batch, out_h, out_w, _ = abs_y.shape
  ns = (k * k * cin, k * k * cout, batch * out_h * out_w)
  for g, r, s, n in zip(got, ref, (abs_y, abs_dx, abs_dw), ns, strict=True):
    assert_within_summation_bound(g, r, s, n + extra_terms, sides=2)


@pytest.mark.parametrize('shape', RESNET18_CONVS, ids=IDS)
def test_im2col_equals_lax_conv_values_and_gradients(shape):
  _, size, cin, cout, k, stride, pad = shape
  x, w = _operands(size, cin, cout, k)
  padding = [(pad, pad)] * 2
  y_ref, (dx_ref, dw_ref) = _value_and_grads('xla', x, w, stride, padding)
  y, (dx, dw) = _value_and_grads('im2col', x, w, stride, padding)
  assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
  assert dx.shape == x.shape and dw.shape == w.shape
  # Was max |diff| <= 1e-5 max |ref| (measured here: <= 4.6e-7); the worst case of the order
  # reaches 2.4e-4 of it (layer4, n = 576), so a host with another vector width could fail it.
  _same_up_to_order((y, dx, dw), (y_ref, dx_ref, dw_ref), x, w, stride, padding)


@pytest.mark.parametrize('fmt', ['bf16', 'bf16_3x', 'tf32', 'f32'])
@pytest.mark.parametrize(
  'shape', [RESNET18_CONVS[3], RESNET18_CONVS[4], RESNET18_CONVS[10]], ids=[IDS[3], IDS[4], IDS[10]]
)
def test_im2col_with_emulated_formats(shape, fmt):
  """Same operand rounding as lax's conv in every emulated format, forward and backward."""
  _, size, cin, cout, k, stride, pad = shape
  x, w = _operands(size, cin, cout, k, seed=1)
  padding = [(pad, pad)] * 2
  y_ref, (dx_ref, dw_ref) = _value_and_grads('xla', x, w, stride, padding, fmt)
  y, (dx, dw) = _value_and_grads('im2col', x, w, stride, padding, fmt)
  # The same rounded operands on both sides (bf16 and tf32 products are exact in f32): only the
  # order differs (was max |diff| <= 1e-5 max |ref|).
  extra = 2 if fmt == 'bf16_3x' else 0
  _same_up_to_order((y, dx, dw), (y_ref, dx_ref, dw_ref), x, w, stride, padding, extra)
  if fmt == 'bf16':  # and the rounding really happened: far from the f32 product
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
  # Each side rounds its f32 sum to bf16 once (8 bits): results one bf16 ulp apart where the two
  # sums straddle a rounding boundary, <= 2^-7 |y| (y's leading bit at 2^e, its ulp 2^(e-7)),
  # plus the order term (~1e-4 of max |y| at most here): within 2^-7 max |y|. The gradients take
  # bf16 cotangent and operands through two such products (chained roundings): 2^-6.
  _close(y, y_ref, 2**-7)
  _close(dx, dx_ref, 2**-6)
  _close(dw, dw_ref, 2**-6)


@pytest.mark.parametrize('padding', ['SAME', 'VALID'])
def test_im2col_string_padding(padding):
  x, w = _operands(7, 4, 6, 3, seed=3)
  for stride in (1, 2):
    ref = ops.conv2d(x, w, stride, padding, impl='xla')
    got = ops.conv2d(x, w, stride, padding, impl='im2col')
    # The order of one f32 sum of 3*3*4 = 36 products (was max |diff| <= 1e-5 max |ref|).
    abs_ref = ops.conv2d(jnp.abs(x), jnp.abs(w), stride, padding, impl='xla')
    assert_within_summation_bound(got, ref, abs_ref, 36, sides=2)


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


def test_auto_rule_on_cpu_small_shapes():
  """1x1 kernels and <= 2x2 outputs (from IM2COL_SMALL_OUT_MIN_MACS) use im2col under 1M MACs."""

  def auto(x_shape, kernel_shape, stride, platform='cpu'):
    return ops.resolve_conv_impl(
      'auto',
      platform,
      macs=ops.conv_macs(x_shape, kernel_shape, stride),
      kernel_hw=kernel_shape[:2],
      out_hw=ops.conv_out_hw(x_shape, stride),
    )

  assert auto((1, 8, 8, 8), (1, 1, 8, 16), 2) == 'im2col'  # 1x1 at 2,048 MACs
  assert auto((1, 8, 8, 8), (1, 1, 8, 16), 2, 'gpu') == 'xla'
  assert auto((1, 2, 2, 64), (3, 3, 64, 64), 1) == 'im2col'  # 2x2 output, 147,456 MACs
  assert auto((1, 4, 4, 32), (3, 3, 32, 64), 2) == 'im2col'  # 4x4/2 -> 2x2, 73,728 MACs
  assert auto((1, 2, 2, 32), (3, 3, 32, 32), 1) == 'xla'  # 2x2 but 36,864 < 50k (smoke preset)
  assert auto((1, 4, 4, 64), (3, 3, 64, 64), 1) == 'xla'  # 4x4 output under 1M MACs
  assert auto((1, 16, 16, 16), (3, 3, 16, 16), 1) == 'xla'
  assert auto((1, 8, 8, 64), (3, 3, 64, 64), 1) == 'im2col'  # 2,359,296 MACs
  out_2x2 = ops.IM2COL_SMALL_OUT_MIN_MACS
  assert (
    ops.resolve_conv_impl('auto', 'cpu', macs=out_2x2, kernel_hw=(3, 3), out_hw=(2, 2)) == 'im2col'
  )
  assert (
    ops.resolve_conv_impl('auto', 'cpu', macs=out_2x2 - 1, kernel_hw=(3, 3), out_hw=(2, 2)) == 'xla'
  )
  assert ops.resolve_conv_impl('xla', 'cpu', macs=10, kernel_hw=(1, 1), out_hw=(1, 1)) == 'xla'


def test_conv2d_auto_applies_the_rule():
  """conv2d(impl='auto') hands the kernel and output size to the rule: a dot for a small 1x1."""
  x, w = _operands(8, 8, 16, 1)
  jaxpr = str(jax.make_jaxpr(lambda x, w: ops.conv2d(x, w, 2, 'VALID', impl='auto'))(x, w))
  assert 'dot_general' in jaxpr and 'conv_general_dilated' not in jaxpr
  x, w = _operands(8, 8, 8, 3)  # 3x3 on an 8x8 map, 36,864 MACs: native
  jaxpr = str(jax.make_jaxpr(lambda x, w: ops.conv2d(x, w, 1, 'SAME', impl='auto'))(x, w))
  assert 'conv_general_dilated' in jaxpr and 'dot_general' not in jaxpr


def test_auto_picks_for_the_digits_presets():
  """smoke: im2col only for its 1x1 downsamples; cpu preset: also its 2x2-output stage 4."""

  def im2col_names(size, width):
    convs = bench_conv.resnet18_convs(size, width, 'small', 1)
    return {c.names[0] for c in convs if bench_conv.auto_pick(c, 'cpu') == 'im2col'}

  downsamples = {f'layer{i}.0.downsample.0' for i in (2, 3, 4)}
  assert im2col_names(8, 0.125) == downsamples
  assert im2col_names(16, 0.25) == downsamples | {'layer4.0.conv1', 'layer4.0.conv2'}
  assert im2col_names(8, 0.25) == downsamples | {
    'layer3.0.conv1',
    'layer3.0.conv2',
    'layer4.0.conv1',
    'layer4.0.conv2',
  }


def test_bench_conv_lists_every_resnet18_convolution():
  convs = bench_conv.resnet18_convs(64)
  assert len(convs) == 11 and sum(len(c.names) for c in convs) == 20  # stem + 16 + 3 downsamples
  assert [c.input_grad for c in convs].count(False) == 1  # the stem's input is the images
  macs = sum(len(c.names) * bench_conv.macs(c) for c in convs)
  config = validation.resolve(common.load(bench_common.DEFAULT_CONFIG))  # 64^2, 1000 classes
  assert macs + 512 * 1000 == bench_step.analytic_macs(config)
  small = bench_conv.resnet18_convs(8, 0.125, 'small', 1)
  assert sum(len(c.names) for c in small) == 20 and small[0].k == 3 and small[0].cin == 1


def test_bench_conv_parse_sizes():
  args = argparse.Namespace(image_size=64, width=1.0, stem='imagenet', batch=64, in_channels=3)
  assert bench_conv.parse_sizes('32,16:0.25:small:128:1', args) == [
    (32, 1.0, 'imagenet', 64, 3),
    (16, 0.25, 'small', 128, 1),
  ]
  with pytest.raises(SystemExit):
    bench_conv.parse_sizes('8:1:tiny', args)


def test_bench_conv_runs(capsys):
  """End to end at a tiny size (nothing timed): the table, one line per config, the last line."""
  bench_conv.main(
    [
      '--image-size',
      '8',
      '--width',
      '0.0625',
      '--stem',
      'small',
      '--batch',
      '2',
      '--in-channels',
      '1',
      '--repeats',
      '1',
      '--min-time',
      '0',
    ]
  )
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('auto_vs_best=')
  assert 0 < float(lines[-1].split('=')[1]) <= 1
  assert lines[-2].startswith('auto_vs_best[8:0.0625:small:2:1]=')
  rows = [
    line.strip('| ').split(' | ')
    for line in lines
    if line.startswith('| ') and not line.startswith('| convolution |')
  ]
  assert len(rows) == 12 and rows[-1][0] == 'total (x count)'  # 11 distinct convs and the total
  assert rows[0][:7] == ['conv1 (dw only)', '8x8x1', '3x3', '1', '4', '1', '2,304']
  assert all(row[-2] in bench_conv.IMPLS and row[-1] in bench_conv.IMPLS for row in rows[:-1])
  assert [row[-2] for row in rows if row[0].endswith('downsample.0')] == ['im2col'] * 3


def test_config_validation_and_record():
  config = digits.get_config('smoke')
  assert config.numerics.conv_impl == 'auto'
  effective = numerics_setup.describe(config)['effective']
  assert effective['conv_impl'].startswith('im2col for 1x1 kernels, >= 1000000 MACs/example')
  assert effective['conv_format'] == 'f32'  # CPU
  config.numerics.conv_impl = 'im2col'
  assert numerics_setup.describe(config)['effective']['conv_impl'] == 'im2col'
  config.numerics.conv_impl = 'xla'
  assert numerics_setup.describe(config)['effective']['conv_impl'] == 'xla'
  config.numerics.conv_impl = 'winograd'
  with pytest.raises(ValueError, match='config.numerics.conv_impl'):
    validation.check_numerics(config)


def test_model_logits_and_gradients_agree_across_impls():
  """The whole ResNet-18 (both stems' convs, every stage) trains the same under both impls."""
  config = digits.get_config('smoke')
  config.model.stem = 'imagenet'
  x = jnp.asarray(np.random.default_rng(4).normal(size=(4, 32, 32, 1)), jnp.float32)
  labels = jnp.arange(4) % 10
  results = {}
  for impl in ('xla', 'im2col'):
    config.numerics.conv_impl = impl
    model = models.build(config, 10, 1, nnx.Rngs(0))
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
  for a, b in zip(
    jax.tree.leaves(results['im2col'][1]), jax.tree.leaves(results['xla'][1]), strict=True
  ):
    _close(a, b, 1e-3)
