"""models/layers.py max_pool: flax's max pool bit for bit, forward and gradient, without a
scatter."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import bench_conv
from tests.support.pools import (
  KINDS,
  assert_same_as_flax,
  flax_pool,
  inputs,
  new_pool,
  output_shape,
)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('hw', [(7, 7), (8, 8), (9, 6), (6, 11)])
def test_stem_pool_equals_flax_bit_for_bit(dtype, hw):
  """Odd and even sizes (odd ones put the bottom/right padding inside the last window), float32
  and bfloat16; ties, signed zeros, -inf and NaN follow XLA's select rule exactly."""
  rng = np.random.default_rng(hw[0] * 100 + hw[1])
  for kind in KINDS:
    x = jnp.asarray(inputs(kind, (3,) + hw + (5,), dtype, rng), dtype)
    cotangent = jnp.asarray(rng.standard_normal(output_shape(x)), dtype)
    assert_same_as_flax(x, cotangent)


def test_other_windows_strides_and_asymmetric_padding():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.integers(0, 4, (2, 9, 10, 3)), jnp.float32)
  for window, strides, padding in [
    ((2, 2), (2, 2), ((0, 1), (1, 0))),
    ((3, 2), (1, 2), ((2, 0), (0, 1))),
  ]:
    kw = dict(window=window, strides=strides, padding=padding)
    cotangent = jnp.asarray(rng.standard_normal(output_shape(x, **kw)), jnp.float32)
    assert_same_as_flax(x, cotangent, **kw)


def test_constructed_ties_go_to_the_first_maximum_in_window_order():
  """All-equal 4x4 input: window (r, c) covers rows 2r-1..2r+1 and columns 2c-1..2c+1; its first
  real element (the padding is -inf, below any finite value) gets its cotangent."""
  x = jnp.ones((1, 4, 4, 1), jnp.float32)
  cotangent = jnp.asarray([[1.0, 2.0], [4.0, 8.0]], jnp.float32).reshape(1, 2, 2, 1)
  grad = assert_same_as_flax(x, cotangent)
  expected = np.zeros((4, 4), np.float32)
  expected[0, 0], expected[0, 1], expected[1, 0], expected[1, 1] = 1, 2, 4, 8
  np.testing.assert_array_equal(np.asarray(grad)[0, :, :, 0], expected)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_padding_is_never_chosen_for_finite_inputs(dtype):
  """Every window's cotangent lands on a real element: with integer cotangents the input gradient
  sums exactly to the cotangent's sum, ties everywhere, odd and even sizes."""
  rng = np.random.default_rng(2)
  for hw in [(7, 7), (8, 9)]:
    x = jnp.asarray(rng.integers(0, 2, (2,) + hw + (3,)), dtype)
    cotangent = jnp.asarray(rng.integers(1, 4, output_shape(x)), dtype)
    grad = assert_same_as_flax(x, cotangent)
    assert float(jnp.sum(grad.astype(jnp.float32))) == float(jnp.sum(cotangent.astype(jnp.float32)))


def test_lowered_gradient_has_no_scatter_or_sort():
  x = jnp.zeros((2, 8, 8, 4), jnp.bfloat16)

  def loss(fn):
    return lambda v: jnp.sum(fn(v).astype(jnp.float32) ** 2)

  old = jax.jit(jax.grad(loss(flax_pool))).lower(x).as_text()
  new = jax.jit(jax.grad(loss(new_pool))).lower(x).as_text()
  assert re.search(r'stablehlo\.select_and_scatter\b', old)  # what it replaces
  assert not re.search(r'stablehlo\.(scatter|select_and_scatter|sort)\b', new)


def test_refuses_a_non_nhwc_input_and_a_window_too_large_for_its_offsets():
  with pytest.raises(ValueError, match='NHWC'):
    new_pool(jnp.zeros((4, 4, 3)))
  with pytest.raises(ValueError, match='at most 256'):
    new_pool(jnp.zeros((1, 20, 20, 1)), window=(17, 16), strides=(1, 1), padding=((0, 0), (0, 0)))


def test_bench_pool_times_both_pools_both_ways(capsys):
  bench_conv.main(
    [
      '--pool',
      '--batch',
      '2',
      '--size',
      '9',
      '--channels',
      '3',
      '--dtype',
      'float32',
      '--steps',
      '1',
      '--windows',
      '1',
      '--warmup',
      '0',
    ]
  )
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith('pool_speedup=') and float(lines[-1].split('=')[1]) > 0
  assert (
    sum(line.startswith(('| flax nnx.max_pool |', '| models/layers.py |')) for line in lines) == 4
  )
