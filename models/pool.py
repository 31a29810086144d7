"""Max pooling with a scatter-free gradient (the ResNet stem's 3x3/2 pool, padding 1).

`max_pool(x, window, strides, padding)` is flax's `nnx.max_pool` on NHWC inputs, bit for bit
(forward and gradient: tests/test_pool.py), computed from dense ops only: no scatter,
select_and_scatter or sort, so XLA's deterministic GPU mode has nothing to serialise. The
gradient's rule (which element of a window takes its cotangent, ties, padding, NaN, the order of
the sums): docs/performance.md ("Deterministic GPU steps").
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax


def _padded_slices(x, window, strides, padding):
  """The window's strided slices of the -inf-padded NHWC `x`, in row-major window order."""
  (top, bottom), (left, right) = padding
  padded = lax.pad(
    x, jnp.array(-jnp.inf, x.dtype), ((0, 0, 0), (top, bottom, 0), (left, right, 0), (0, 0, 0))
  )
  n, height, width, channels = padded.shape
  out_h = (height - window[0]) // strides[0] + 1
  out_w = (width - window[1]) // strides[1] + 1
  return [
    lax.slice(
      padded,
      (0, i, j, 0),
      (n, i + (out_h - 1) * strides[0] + 1, j + (out_w - 1) * strides[1] + 1, channels),
      (1, strides[0], strides[1], 1),
    )
    for i in range(window[0])
    for j in range(window[1])
  ]


def _pool_and_choice(x, window, strides, padding):
  """(max over the window, the offset XLA's select `>=` chooses, as uint8)."""
  slices = _padded_slices(x, window, strides, padding)
  out = chosen = slices[0]
  choice = jnp.zeros(out.shape, jnp.uint8)
  for offset, candidate in enumerate(slices[1:], start=1):
    out = lax.max(out, candidate)
    take = ~(chosen >= candidate)
    chosen = jnp.where(take, candidate, chosen)
    choice = jnp.where(take, jnp.uint8(offset), choice)
  return out, choice


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _max_pool(x, window, strides, padding):
  slices = _padded_slices(x, window, strides, padding)
  return functools.reduce(lax.max, slices)


def _max_pool_fwd(x, window, strides, padding):
  out, choice = _pool_and_choice(x, window, strides, padding)
  return out, (choice, x.shape)


def _max_pool_bwd(window, strides, padding, residuals, cotangent):
  choice, (_, height, width, _) = residuals
  (top, _), (left, _) = padding
  out_h, out_w = cotangent.shape[1:3]
  zero = jnp.zeros((), cotangent.dtype)
  total = None
  offsets = [(i, j) for i in range(window[0]) for j in range(window[1])]
  # Descending offsets = ascending windows for each input element: XLA:CPU's order of additions.
  for offset in reversed(range(len(offsets))):
    i, j = offsets[offset]
    share = jnp.where(choice == offset, cotangent, zero)
    # Output (r, c) came from padded input (i + r*stride, j + c*stride); crop the padding.
    rows = (i - top, height + top - i - (out_h - 1) * strides[0] - 1, strides[0] - 1)
    cols = (j - left, width + left - j - (out_w - 1) * strides[1] - 1, strides[1] - 1)
    placed = lax.pad(share, zero, ((0, 0, 0), rows, cols, (0, 0, 0)))
    total = placed if total is None else total + placed
  return (total,)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


def max_pool(x, window, strides, padding):
  """`nnx.max_pool(x, window, strides, padding)` for NHWC `x` (see the module doc): `window` and
  `strides` pairs of ints, `padding` ((top, bottom), (left, right))."""
  if x.ndim != 4:
    raise ValueError(f'max_pool: NHWC input expected, got shape {x.shape}')
  if window[0] * window[1] > 256:  # the chosen offset is kept as uint8
    raise ValueError(f'max_pool: windows of at most 256 elements, got {tuple(window)}')
  pairs = tuple((int(lo), int(hi)) for lo, hi in padding)
  return _max_pool(x, tuple(map(int, window)), tuple(map(int, strides)), pairs)
