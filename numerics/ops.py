"""The two products every layer goes through: a convolution and a dense matmul.

Every Conv and Linear of the model calls these, so a numerics setting applied here applies to the
whole model, forward and backward: `fmt` 'native' is the platform's own product under
`jax_default_matmul_precision`, any other format is emulated (numerics/emulate.py). Convolutions
run as 'xla' or 'im2col' (`resolve_conv_impl`; 'auto' by the measured shapes), and a noisy format
takes its key from the step's `noise_scope`. See docs/numerics.md ("Convolutions: xla and im2col")
and docs/performance.md ("Convolutions on CPU").
"""

import contextlib

import jax
import jax.numpy as jnp
from jax import lax

from numerics import emulate as emulate_lib
from numerics import target
from numerics.formats import CONV_IMPLS

CONV_DIMENSIONS = ('NHWC', 'HWIO', 'NHWC')
NOISE_STREAMS = {'train': 0, 'eval': 1}
NOISE_TAG = 0x6E6F6973  # folded into the seed's key first: the noise never reuses another stream
_NOISE_SCOPE: list[
  jax.Array
] = []  # the keys of the open noise_scope()s, innermost last (trace time)
IM2COL_MIN_MACS = 1_000_000  # per example: every 3x3 conv of ResNet-18 (width 1) at 32^2 and up
IM2COL_SMALL_OUT_PIXELS = 4  # output maps of at most 2x2: ResNet-18's last stages on small images
IM2COL_SMALL_OUT_MIN_MACS = 50_000  # ... from this size: not the smoke preset's (<= 36,864)


def step_noise_key(seed, step, stream):
  """The noise key of global step `step` (traced or not) of the run with `seed`, per stream."""
  key = jax.random.fold_in(jax.random.key(seed), NOISE_TAG)
  return jax.random.fold_in(jax.random.fold_in(key, NOISE_STREAMS[stream]), step)


@contextlib.contextmanager
def noise_scope(key):
  """Products traced inside draw their noise from `key`: the step's (trainer/steps.py), keyed by
  (run seed, global step, train or eval); each layer folds in its static id (`noise_key`)."""
  _NOISE_SCOPE.append(key)
  try:
    yield
  finally:
    _NOISE_SCOPE.pop()


def noise_key(fmt, product_id):
  """The key of the product `product_id` (a static int) in format `fmt`: None unless the format
  is noisy; raises if a noisy product is traced outside noise_scope."""
  if fmt not in emulate_lib.NOISY_FORMATS:
    return None
  if not _NOISE_SCOPE:
    raise ValueError(
      f'numerics: the {fmt!r} product needs a noise key: trace the model inside '
      'numerics.ops.noise_scope(key) (trainer/steps.py does, per step)'
    )
  return jax.random.fold_in(_NOISE_SCOPE[-1], product_id)


def resolve_conv_impl(impl, platform=None, macs=None, *, kernel_hw=None, out_hw=None):
  """'auto' -> 'xla' off CPU; on CPU 'im2col' except for the shapes where 'xla' is kept.

  On CPU: 'im2col' with no shape given (`macs` None), for 1x1 kernels (`kernel_hw`), for
  `macs` >= IM2COL_MIN_MACS per example, and for output maps (`out_hw`) of at most
  IM2COL_SMALL_OUT_PIXELS pixels from IM2COL_SMALL_OUT_MIN_MACS on; 'xla' for the rest (as
  benchmarks/bench_conv.py measured: BENCHMARKS.md, "Conv implementation", "Per convolution").
  """
  if impl not in CONV_IMPLS:
    raise ValueError(f'config.numerics.conv_impl must be one of {CONV_IMPLS}, got {impl!r}')
  if impl != 'auto':
    return impl
  platform = platform or target.current()
  if platform != 'cpu':
    return 'xla'
  if macs is None or macs >= IM2COL_MIN_MACS:
    return 'im2col'
  pointwise = kernel_hw is not None and tuple(kernel_hw) == (1, 1)
  small_out = (
    out_hw is not None
    and out_hw[0] * out_hw[1] <= IM2COL_SMALL_OUT_PIXELS
    and macs >= IM2COL_SMALL_OUT_MIN_MACS
  )
  return 'im2col' if pointwise or small_out else 'xla'


def conv_out_hw(x_shape, stride):
  """Output height and width of an NHWC convolution with 'SAME'-like padding."""
  return -(-x_shape[1] // stride), -(-x_shape[2] // stride)


def conv_macs(x_shape, kernel_shape, stride):
  """Multiply-adds per example of an NHWC x HWIO convolution ('SAME'-like output size)."""
  k_h, k_w, c_in, c_out = kernel_shape
  h_out, w_out = conv_out_hw(x_shape, stride)
  return h_out * w_out * k_h * k_w * c_in * c_out


def _native_conv(x, kernel, stride, padding, precision=None):
  return lax.conv_general_dilated(
    x,
    kernel,
    window_strides=(stride, stride),
    padding=padding,
    dimension_numbers=CONV_DIMENSIONS,
    precision=precision,
  )


def _explicit_padding(padding, in_hw, kernel_hw, stride):
  """'SAME' / 'VALID' / [(lo, hi), (lo, hi)] -> [(lo, hi), (lo, hi)], as lax computes them."""
  if isinstance(padding, str):
    return lax.padtype_to_pads(in_hw, kernel_hw, (stride, stride), padding)
  return [tuple(int(p) for p in pair) for pair in padding]


def _im2col_conv(x, kernel, stride, padding, precision=None):
  """NHWC x HWIO convolution as k*k strided slices, one concatenation and one matmul."""
  kh, kw, cin, cout = kernel.shape
  n, h, w, c = x.shape
  if c != cin:
    raise ValueError(f'conv2d: input has {c} channels, kernel expects {cin}')
  (pt, pb), (pl, pr) = _explicit_padding(padding, (h, w), (kh, kw), stride)
  if pt or pb or pl or pr:
    x = lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), (pt, pb, 0), (pl, pr, 0), (0, 0, 0)))
  hp, wp = h + pt + pb, w + pl + pr
  ho, wo = (hp - kh) // stride + 1, (wp - kw) // stride + 1
  slices = [
    lax.slice(
      x,
      (0, i, j, 0),
      (n, i + (ho - 1) * stride + 1, j + (wo - 1) * stride + 1, c),
      (1, stride, stride, 1),
    )
    for i in range(kh)
    for j in range(kw)
  ]
  patches = slices[0] if len(slices) == 1 else lax.concatenate(slices, 3)  # [N,Ho,Wo,kh*kw*C]
  # Row-major HWIO -> [(i, j, c), O]: the same (i, j, c) order as the concatenated patches.
  out_dtype = jnp.result_type(x, kernel)
  y = lax.dot_general(
    patches,
    kernel.reshape(kh * kw * cin, cout),
    (((3,), (0,)), ((), ())),
    precision=precision,
    preferred_element_type=jnp.float32,
  )
  return y.astype(out_dtype)


CONV_PRODUCTS = {'xla': _native_conv, 'im2col': _im2col_conv}


def _native_dense(x, kernel, precision=None):
  return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def conv2d(
  x, kernel, stride=1, padding='SAME', *, fmt='native', impl='xla', emulate_impl='auto', key=None
):
  """NHWC x HWIO convolution; padding is 'SAME', 'VALID' or [(lo, hi), (lo, hi)].

  `fmt`: the product format ('native': the platform's own; else numerics/emulate.py FORMATS).

  `impl`: 'xla', 'im2col' or 'auto' (`resolve_conv_impl`); the numerics are the same up to the f32
  summation order. `emulate_impl`, `key`: see numerics/emulate.py `emulated`.
  """
  impl = resolve_conv_impl(
    impl,
    macs=conv_macs(x.shape, kernel.shape, stride),
    kernel_hw=kernel.shape[:2],
    out_hw=conv_out_hw(x.shape, stride),
  )
  product = CONV_PRODUCTS[impl]
  if fmt == 'native':
    return product(x, kernel, stride, padding)
  return emulate_lib.emulated(
    lambda a, b, precision: product(a, b, stride, padding, precision),
    x,
    kernel,
    fmt,
    key=key,
    impl=emulate_impl,
  )


def dense(x, kernel, *, fmt='native', emulate_impl='auto', key=None):
  """x [..., in] @ kernel [in, out]; `fmt` as in conv2d."""
  if fmt == 'native':
    return _native_dense(x, kernel)
  return emulate_lib.emulated(_native_dense, x, kernel, fmt, key=key, impl=emulate_impl)
