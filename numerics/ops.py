"""The two products every layer goes through: a convolution and a dense matmul.

Every Conv and Linear in `models/` calls these, so a numerics setting applied here applies to the
whole model, forward and backward. `emulate='none'` is the platform's native arithmetic under
`jax_default_matmul_precision`; the other modes reproduce a given hardware product format on any
backend (see `numerics/emulate.py`).
"""

from jax import lax

from numerics import emulate as emulate_lib

CONV_DIMENSIONS = ('NHWC', 'HWIO', 'NHWC')


def _native_conv(x, kernel, stride, padding, precision=None):
  return lax.conv_general_dilated(
      x, kernel, window_strides=(stride, stride), padding=padding,
      dimension_numbers=CONV_DIMENSIONS, precision=precision)


def _native_dense(x, kernel, precision=None):
  return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def conv2d(x, kernel, stride=1, padding='SAME', *, emulate='none'):
  """NHWC x HWIO convolution; padding is 'SAME', 'VALID' or [(lo, hi), (lo, hi)]."""
  if emulate == 'none':
    return _native_conv(x, kernel, stride, padding)
  return emulate_lib.emulated(
      lambda a, b, precision: _native_conv(a, b, stride, padding, precision), x, kernel, emulate)


def dense(x, kernel, *, emulate='none'):
  """x [..., in] @ kernel [in, out]."""
  if emulate == 'none':
    return _native_dense(x, kernel)
  return emulate_lib.emulated(_native_dense, x, kernel, emulate)
