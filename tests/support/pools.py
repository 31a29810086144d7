"""models/layers.py beside flax's max pool: both pools' forward and gradient, their bits compared,
and the inputs that exercise the tie rule (random, tied, signed zeros, -inf, NaN)."""

import jax
import numpy as np
from flax import nnx

from models import layers

STEM = ((3, 3), (2, 2), ((1, 1), (1, 1)))  # the ResNet stem's pool: window, strides, padding


def flax_pool(x, window=STEM[0], strides=STEM[1], padding=STEM[2]):
  return nnx.max_pool(x, window, strides=strides, padding=padding)


def new_pool(x, window=STEM[0], strides=STEM[1], padding=STEM[2]):
  return layers.max_pool(x, window, strides, padding)


def forward_and_grad(fn, x, cotangent):
  out, vjp = jax.vjp(fn, x)
  return out, vjp(cotangent)[0]


def bits(a):
  """The array's raw bytes as unsigned ints: equal bits, not merely equal values (-0.0 != 0.0)."""
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


@jax.jit
def flax_forward_and_grad(x, cotangent):
  return forward_and_grad(flax_pool, x, cotangent)


@jax.jit
def new_forward_and_grad(x, cotangent):
  return forward_and_grad(new_pool, x, cotangent)


def assert_same_as_flax(x, cotangent, **kw):
  """Forward and gradient bit-identical to jax.grad of nnx.max_pool (the stem's pool unless `kw`
  gives another window, strides and padding)."""
  if kw:
    (out_a, grad_a), (out_b, grad_b) = (
      jax.jit(lambda x, g, fn=fn: forward_and_grad(lambda v: fn(v, **kw), x, g))(x, cotangent)
      for fn in (flax_pool, new_pool)
    )
  else:  # compiled once per shape and dtype
    (out_a, grad_a), (out_b, grad_b) = (
      flax_forward_and_grad(x, cotangent),
      new_forward_and_grad(x, cotangent),
    )
  np.testing.assert_array_equal(bits(out_a), bits(out_b))
  np.testing.assert_array_equal(bits(grad_a), bits(grad_b))
  return grad_b


def output_shape(x, window=STEM[0], strides=STEM[1], padding=STEM[2]):
  n, h, w, c = x.shape

  def size(d, k, s, p):
    return (d + sum(p) - k) // s + 1

  return (
    n,
    size(h, window[0], strides[0], padding[0]),
    size(w, window[1], strides[1], padding[1]),
    c,
  )


def inputs(kind, shape, dtype, rng):
  if kind == 'random':  # continuous values: no ties (almost surely)
    return rng.standard_normal(shape)
  if kind == 'ties':  # three values: most windows hold several maxima
    return rng.integers(0, 3, shape).astype(np.float64)
  if kind == 'signed zeros':  # a ReLU output's zeros carry either sign
    return rng.choice([0.0, -0.0, 1.0], shape)
  if kind == '-inf':  # windows whose real elements are all -inf: the padding ties with them
    return rng.choice([-np.inf, 1.0], shape, p=[0.8, 0.2])
  return rng.choice([np.nan, 1.0, 2.0], shape, p=[0.2, 0.4, 0.4])  # 'nan'


KINDS = ('random', 'ties', 'signed zeros', '-inf', 'nan')
