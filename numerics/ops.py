"""The two products every layer goes through, a convolution and a dense matmul, and their emulation
in a number format, forward and backward, for the platform a step is traced for."""

import contextlib
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core

from numerics import formats
from numerics.formats import CONV_IMPLS, EMULATE_IMPLS, FORMATS, NATIVE

CONV_DIMENSIONS = ('NHWC', 'HWIO', 'NHWC')
HIGHEST = lax.Precision.HIGHEST
IM2COL_MIN_MACS = 1_000_000  # per example: every 3x3 conv of ResNet-18 (width 1) at 32^2 and up
IM2COL_SMALL_OUT_PIXELS = 4  # output maps of at most 2x2: ResNet-18's last stages on small images
IM2COL_SMALL_OUT_MIN_MACS = 50_000  # ... from this size: not the smoke preset's (<= 36,864)
SPLIT_PASSES = ((1, 1), (0, 1), (1, 0), (0, 0))  # a split plan's exact hi/lo parts, small first
NOISE_STREAMS = {'train': 0, 'eval': 1}
NOISE_TAG = 0x6E6F6973  # folded into the seed's key first: the noise never reuses another stream
# Global, a trace-time context as jax.default_matmul_precision is: each layer reads the key of the
# step being traced without every model threading a key argument through its blocks.
_NOISE_SCOPE: list[jax.Array] = []


def step_noise_key(seed, step, stream):
  """The noise key of global step `step` (traced or not) of the run with `seed`, per stream."""
  key = jax.random.fold_in(jax.random.key(seed), NOISE_TAG)
  return jax.random.fold_in(jax.random.fold_in(key, NOISE_STREAMS[stream]), step)


@contextlib.contextmanager
def noise_scope(key):
  """Products traced inside draw their noise from `key` (the step's: trainer/train.py)."""
  _NOISE_SCOPE.append(key)
  try:
    yield
  finally:
    _NOISE_SCOPE.pop()


def noise_key(fmt, product_id):
  """The key of product `product_id` in format `fmt` (None unless the format is noisy)."""
  if fmt == NATIVE or not FORMATS[fmt].noisy:
    return None
  if not _NOISE_SCOPE:
    raise ValueError(
      f'numerics: the {fmt!r} product needs a noise key: trace the model inside '
      'numerics.ops.noise_scope(key) (trainer/train.py does, per step)'
    )
  return jax.random.fold_in(_NOISE_SCOPE[-1], product_id)


def resolve_conv_impl(impl, platform=None, macs=None, *, kernel_hw=None, out_hw=None):
  """'auto' -> 'xla' off CPU; on CPU 'im2col' for the shapes XLA:CPU runs slowly (BENCHMARKS.md)."""
  if impl not in CONV_IMPLS:
    raise ValueError(f'config.numerics.conv_impl must be one of {CONV_IMPLS}, got {impl!r}')
  if impl != 'auto':
    return impl
  if (platform or jax.default_backend()) != 'cpu':
    return 'xla'
  if macs is None or macs >= IM2COL_MIN_MACS:
    return 'im2col'
  pointwise = kernel_hw is not None and tuple(kernel_hw) == (1, 1)
  small_out = out_hw is not None and out_hw[0] * out_hw[1] <= IM2COL_SMALL_OUT_PIXELS
  return 'im2col' if pointwise or (small_out and macs >= IM2COL_SMALL_OUT_MIN_MACS) else 'xla'


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
    x, kernel, (stride, stride), padding, dimension_numbers=CONV_DIMENSIONS, precision=precision
  )


def window_slices(x, window, strides, padding, fill):
  """The strided slices of NHWC `x` padded with `fill`, one per window offset, row-major."""
  (top, bottom), (left, right) = padding
  if top or bottom or left or right:
    pads = ((0, 0, 0), (top, bottom, 0), (left, right, 0), (0, 0, 0))
    x = lax.pad(x, jnp.array(fill, x.dtype), pads)
  n, height, width, channels = x.shape
  out_h = (height - window[0]) // strides[0] + 1
  out_w = (width - window[1]) // strides[1] + 1
  return [
    lax.slice(
      x,
      (0, i, j, 0),
      (n, i + (out_h - 1) * strides[0] + 1, j + (out_w - 1) * strides[1] + 1, channels),
      (1, strides[0], strides[1], 1),
    )
    for i in range(window[0])
    for j in range(window[1])
  ]


def _im2col_conv(x, kernel, stride, padding, precision=None):
  """NHWC x HWIO convolution as k*k strided slices, one concatenation and one matmul."""
  kh, kw, cin, cout = kernel.shape
  _, h, w, c = x.shape
  if c != cin:
    raise ValueError(f'conv2d: input has {c} channels, kernel expects {cin}')
  if isinstance(padding, str):  # 'SAME' / 'VALID' -> [(lo, hi), (lo, hi)], as lax computes them
    padding = lax.padtype_to_pads((h, w), (kh, kw), (stride, stride), padding)
  pairs = [tuple(int(p) for p in pair) for pair in padding]
  slices = window_slices(x, (kh, kw), (stride, stride), pairs, 0)
  patches = slices[0] if len(slices) == 1 else lax.concatenate(slices, 3)  # [N,Ho,Wo,kh*kw*C]
  # Row-major HWIO -> [(i, j, c), O]: the same (i, j, c) order as the concatenated patches.
  flat = kernel.reshape(kh * kw * cin, cout)
  y = lax.dot_general(
    patches, flat, (((3,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
  )
  return y.astype(jnp.result_type(x, kernel))


CONV_PRODUCTS = {'xla': _native_conv, 'im2col': _im2col_conv}


def _native_dense(x, kernel, precision=None):
  return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def conv2d(
  x,
  kernel,
  stride=1,
  padding='SAME',
  *,
  fmt=NATIVE,
  impl='xla',
  emulate_impl='auto',
  key=None,
  platform=None,
):
  """NHWC x HWIO convolution in format `fmt` (padding 'SAME', 'VALID' or pairs) by `impl`."""
  macs, out_hw = conv_macs(x.shape, kernel.shape, stride), conv_out_hw(x.shape, stride)
  impl = resolve_conv_impl(impl, platform, macs, kernel_hw=kernel.shape[:2], out_hw=out_hw)
  product = CONV_PRODUCTS[impl]
  if fmt == NATIVE:
    return product(x, kernel, stride, padding)

  def conv(a, b, precision):
    return product(a, b, stride, padding, precision)

  return emulated(conv, x, kernel, fmt, key=key, impl=emulate_impl, platform=platform)


def dense(x, kernel, *, fmt=NATIVE, emulate_impl='auto', key=None, platform=None):
  """x [..., in] @ kernel [in, out] in format `fmt`."""
  if fmt == NATIVE:
    return _native_dense(x, kernel)
  return emulated(_native_dense, x, kernel, fmt, key=key, impl=emulate_impl, platform=platform)


def resolve_impl(impl, platform=None, fmt=None):
  """What emulate_impl `impl` means for `fmt` on `platform`: 'fast' or 'reference' (or 'native')."""
  if impl not in EMULATE_IMPLS:
    raise ValueError(f'config.numerics.emulate_impl must be one of {EMULATE_IMPLS}, got {impl!r}')
  if fmt is None:
    return impl
  if fmt == NATIVE:
    return NATIVE
  if FORMATS[fmt].fast is None:
    return 'reference'  # no faster exact form
  if impl != 'auto':
    return impl
  return 'reference' if (platform or jax.default_backend()) == 'cpu' else 'fast'


def fast_plan(fmt, platform=None):
  """The FastPlan of `fmt` on `platform` (one the entry does not name computes as the CPU's)."""
  plans = FORMATS[fmt].fast
  if plans is None:
    raise ValueError(f'numerics: {fmt!r} has no fast form')
  return plans.get(platform or jax.default_backend(), plans['cpu'])


def operand_parts(fmt, a, key=None):
  """The parts of operand `a` that `fmt` multiplies, as f32: the one rounding of both forms."""
  return FORMATS[fmt].operands(jnp.asarray(a, jnp.float32), key)


def fast_operands(fmt, a, plan):
  """What the fast path multiplies for `a`: operand_parts (split where plan.split) as plan.dtype."""
  parts = operand_parts(fmt, a)
  if plan.split:
    (part,) = parts
    parts = list(formats.split_exact_bf16(part))
  return [p.astype(plan.dtype) for p in parts]


def _sum_passes(multiply, pa, pb, order):
  """sum over (i, j) in `order`, left to right, of multiply(pa[i], pb[j])."""
  total = None
  for i, j in order:
    term = multiply(pa[i], pb[j])
    total = term if total is None else total + term
  return total


def emulated_bilinear(f, a, b, fmt, key=None, plan=None):
  """f(a, b, precision), bilinear in (a, b), in format `fmt`; f32 result, no custom gradient."""
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  if plan is None:
    keys = (None, None) if key is None else (jax.random.fold_in(key, 0), jax.random.fold_in(key, 1))
    pa, pb = operand_parts(fmt, a, keys[0]), operand_parts(fmt, b, keys[1])
    return _sum_passes(lambda p, q: f(p, q, HIGHEST), pa, pb, FORMATS[fmt].passes)
  pa, pb = fast_operands(fmt, a, plan), fast_operands(fmt, b, plan)
  multiply = retyped(f, a.shape, b.shape, lax.Precision[plan.precision])
  return _sum_passes(multiply, pa, pb, SPLIT_PASSES if plan.split else FORMATS[fmt].passes)


# Primitives that only move or copy values: exact in any dtype, so the fast path runs them in the
# operands' (narrow) dtype.
_MOVES = frozenset(
  'pad slice concatenate reshape transpose rev broadcast_in_dim squeeze expand_dims split '
  'copy copy_p'.split()
)
_CONTRACTIONS = {'dot_general', 'conv_general_dilated'}


def retyped(f, a_shape, b_shape, precision):
  """(p, q) -> f(p, q), every contraction in p's and q's dtype at `precision`, f32 result."""
  closed = jax.make_jaxpr(lambda p, q: f(p, q, HIGHEST))(
    jax.ShapeDtypeStruct(a_shape, jnp.float32), jax.ShapeDtypeStruct(b_shape, jnp.float32)
  )
  return lambda p, q: _eval_retyped(closed.jaxpr, closed.consts, [p, q], precision)[0]


def _contract(eqn, values, precision):
  """The contraction `eqn` on `values` (cast to their common dtype) at `precision`, f32 result."""
  dtype = jnp.result_type(*values)
  params = dict(eqn.params, precision=(precision, precision), preferred_element_type=jnp.float32)
  bind = functools.partial(eqn.primitive.bind, **params)
  values = [jnp.asarray(v, dtype) for v in values]
  if dtype == jnp.float32:
    return bind(*values)
  return lax.platform_dependent(
    *values, cpu=lambda *vs: bind(*[v.astype(jnp.float32) for v in vs]), default=bind
  )


def _eval_retyped(jaxpr, consts, args, precision):
  """Evaluate `jaxpr` on `args` (see `retyped`): contractions re-typed, moves in their input's
  dtype, any other operation on its inputs converted exactly to the declared dtypes."""
  env = dict(zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args], strict=True))

  def read(v):
    return v.val if isinstance(v, jex_core.Literal) else env[v]

  for eqn in jaxpr.eqns:
    values = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    if name in _CONTRACTIONS:
      outs = _contract(eqn, values, precision)
    elif name in _MOVES:
      dtype = jnp.result_type(values[0])
      outs = eqn.primitive.bind(*[jnp.asarray(v, dtype) for v in values], **eqn.params)
    elif name in ('jit', 'pjit'):
      inner = eqn.params['jaxpr']
      outs = _eval_retyped(inner.jaxpr, inner.consts, values, precision)
    else:
      if any(jex_core.jaxprs_in_params(eqn.params)):
        raise ValueError(f'numerics: the fast path cannot re-type a {name!r} in a product')
      values = [jnp.asarray(v, v_in.aval.dtype) for v, v_in in zip(values, eqn.invars, strict=True)]
      outs = eqn.primitive.bind(*values, **eqn.params)
    outs = outs if eqn.primitive.multiple_results else [outs]
    for var, value in zip(eqn.outvars, outs, strict=True):
      env[var] = value
  return [read(v) for v in jaxpr.outvars]


def _transposed(product, shape, argnum):
  """The product transposed in argument `argnum` (0: x, 1: the kernel): the backward product."""
  spec = jax.ShapeDtypeStruct(shape, jnp.float32)

  def in_x(dy, k, precision):
    return jax.linear_transpose(lambda x: product(x, k, precision), spec)(dy)[0]

  def in_k(x, dy, precision):
    return jax.linear_transpose(lambda k: product(x, k, precision), spec)(dy)[0]

  return in_k if argnum else in_x


def _pass_key(key, index):
  """The key of one of a product's passes (0 forward, 1 input gradient, 2 kernel gradient)."""
  return None if key is None else jax.random.fold_in(key, index)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 5))
def _emulated(product, x, kernel, fmt, key, plan):
  return emulated_bilinear(product, x, kernel, fmt, _pass_key(key, 0), plan)


def _emulated_fwd(product, x, kernel, fmt, key, plan):
  return emulated_bilinear(product, x, kernel, fmt, _pass_key(key, 0), plan), (x, kernel, key)


def _emulated_bwd(product, fmt, plan, residuals, dy):
  x, kernel, key = residuals
  dy = dy.astype(jnp.float32)
  dx = emulated_bilinear(_transposed(product, x.shape, 0), dy, kernel, fmt, _pass_key(key, 1), plan)
  dk = emulated_bilinear(_transposed(product, kernel.shape, 1), x, dy, fmt, _pass_key(key, 2), plan)
  return dx.astype(x.dtype), dk.astype(kernel.dtype), None


_emulated.defvjp(_emulated_fwd, _emulated_bwd)


def emulated(product, x, kernel, fmt, *, key=None, impl='auto', platform=None):
  """product(x, kernel) (bilinear) forward and backward in format `fmt`, in its native dtype."""
  if FORMATS[fmt].noisy != (key is not None):
    raise ValueError(
      f'numerics: the {fmt!r} product '
      + ('needs a PRNG key' if key is None else 'takes no PRNG key')
    )
  fast = resolve_impl(impl, platform, fmt) == 'fast'
  plan = fast_plan(fmt, platform) if fast else None
  out_dtype = jnp.result_type(x, kernel)
  return _emulated(product, x, kernel, fmt, key, plan).astype(out_dtype)
