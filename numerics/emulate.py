"""Emulated hardware product formats: the same arithmetic on TPU, GPU and CPU.

`emulated(product, x, kernel, mode)` computes the bilinear `product(x, kernel, precision)` (a
convolution or a matmul; `precision` is a lax.Precision) the way a given hardware format would:

  'bf16'    one bf16 pass: both operands rounded to bf16, products accumulated in f32 (a TPU MXU at
            DEFAULT precision, `BF16_BF16_F32`).
  'bf16_3x' three bf16 passes: x = xh + xl, k = kh + kl (bf16 parts), xh*kh + xh*kl + xl*kh with
            f32 accumulation (a TPU at HIGH precision, `BF16_BF16_F32_X3`).
  'tf32'    both operands rounded to TF32 (10-bit mantissa), f32 accumulation (a GPU tensor core at
            DEFAULT/HIGH, `TF32_TF32_F32`).
  'f32'     the plain product at HIGHEST (true f32 on GPU, 6 bf16 passes on TPU, f32 on CPU).
  'bf16_noise' the matched-magnitude noise control: each operand moved by independent uniform noise
            of +-1/2 bf16 ulp (rounding.dither_bf16), then the product at HIGHEST. Its
            perturbation has the size of bf16 rounding but no systematic part; it needs a PRNG
            `key`, and every operand of every pass (forward and backward) draws its own noise
            from it, so a given key repeats bit for bit.
  'none'    not emulated: the native product under `jax_default_matmul_precision` (numerics/ops.py
            does not call this module then).

Every pass is computed at lax.Precision.HIGHEST on exactly representable operands: products of two
bf16 (or TF32) values are exact in f32, so only the rounding of the operands and the f32
accumulation remain, which is what the hardware does (up to summation order). Rounding is
round-to-nearest-even (numerics/rounding.py).

The backward pass is emulated too: the gradients are themselves bilinear products (the transposes of
`product`), of the incoming cotangent with the other operand, and each is computed in the same
format: for bf16, dx = T_x(bf16(dy), bf16(k)) and dk = T_k(bf16(x), bf16(dy)), as on a TPU, where
the backward convolutions and matmuls run on the MXU at the same default precision.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from numerics import rounding

EMULATE_MODES = ('none', 'bf16', 'bf16_3x', 'tf32', 'f32', 'bf16_noise')
NOISY_MODES = ('bf16_noise',)  # these need a PRNG key
# How an emulated product is computed: 'reference' = rounded operands multiplied at HIGHEST (this
# module); 'auto' = the fastest implementation known to give the same products on the platform
# (today the reference on every platform).
EMULATE_IMPLS = ('auto', 'reference')
HIGHEST = lax.Precision.HIGHEST


def resolve_impl(impl, platform=None, mode=None):
  """The implementation `impl` means for `mode` on `platform`: 'reference' (see EMULATE_IMPLS)."""
  del platform, mode  # one implementation so far
  if impl not in EMULATE_IMPLS:
    raise ValueError(f'config.numerics.emulate_impl must be one of {EMULATE_IMPLS}, got {impl!r}')
  return 'reference'


def _passes(mode, a, key=None):
  """The parts of operand `a` (f32) that `mode` multiplies: [a] or [hi, lo]."""
  if mode == 'bf16_noise':
    return [rounding.dither_bf16(a, key)]
  if mode == 'bf16':
    return [rounding.round_bf16(a)]
  if mode == 'tf32':
    return [rounding.round_tf32(a)]
  if mode == 'bf16_3x':
    return list(rounding.split_bf16(a))
  if mode == 'f32':
    return [a]
  raise ValueError(f'config.numerics.emulate must be one of {EMULATE_MODES}, got {mode!r}')


def _operand_keys(key):
  """Independent keys for the two operands of one product (None: no noise)."""
  if key is None:
    return None, None
  return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)


def emulated_bilinear(f, a, b, mode, key=None):
  """f(a, b, precision), bilinear in (a, b), in `mode`'s format; f32 result. No custom gradient.

  `key`: the noise of a NOISY_MODES mode (each operand draws from its own fold of it).
  """
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  key_a, key_b = _operand_keys(key)
  pa, pb = _passes(mode, a, key_a), _passes(mode, b, key_b)
  if len(pa) == 1:
    return f(pa[0], pb[0], HIGHEST)
  (ah, al), (bh, bl) = pa, pb
  # Small terms first, then the large one: the order XLA's X3 decomposition uses.
  return (f(ah, bl, HIGHEST) + f(al, bh, HIGHEST)) + f(ah, bh, HIGHEST)


def _transpose_x(product, x_shape):
  """(dy, k, precision) -> d/dx <dy, product(x, k)>: the transposed product in x."""
  x_spec = jax.ShapeDtypeStruct(x_shape, jnp.float32)

  def t(dy, k, precision):
    return jax.linear_transpose(lambda x: product(x, k, precision), x_spec)(dy)[0]
  return t


def _transpose_k(product, k_shape):
  """(x, dy, precision) -> d/dk <dy, product(x, k)>: the transposed product in k."""
  k_spec = jax.ShapeDtypeStruct(k_shape, jnp.float32)

  def t(x, dy, precision):
    return jax.linear_transpose(lambda k: product(x, k, precision), k_spec)(dy)[0]
  return t


def _pass_key(key, index):
  """The key of one of a product's three passes (0 forward, 1 input gradient, 2 kernel gradient)."""
  return None if key is None else jax.random.fold_in(key, index)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _emulated(product, x, kernel, mode, key):
  return emulated_bilinear(product, x, kernel, mode, _pass_key(key, 0))


def _emulated_fwd(product, x, kernel, mode, key):
  return emulated_bilinear(product, x, kernel, mode, _pass_key(key, 0)), (x, kernel, key)


def _emulated_bwd(product, mode, residuals, dy):
  x, kernel, key = residuals
  dy = dy.astype(jnp.float32)
  dx = emulated_bilinear(_transpose_x(product, x.shape), dy, kernel, mode, _pass_key(key, 1))
  dk = emulated_bilinear(_transpose_k(product, kernel.shape), x, dy, mode, _pass_key(key, 2))
  return dx.astype(x.dtype), dk.astype(kernel.dtype), None


_emulated.defvjp(_emulated_fwd, _emulated_bwd)


def emulated(product, x, kernel, mode, *, key=None, impl='auto'):
  """product(x, kernel) computed, forward and backward, in `mode`'s format (see module doc).

  `product(a, b, precision)` must be bilinear in (a, b). The result has the dtype the native
  product would have (bf16 operands give a bf16 result, accumulated in f32 first). `key`: a PRNG
  key, required by (and only used by) NOISY_MODES. `impl`: see EMULATE_IMPLS.
  """
  if mode not in EMULATE_MODES or mode == 'none':
    raise ValueError(f"config.numerics.emulate must be one of {EMULATE_MODES[1:]} here "
                     f"('none' uses the native product), got {mode!r}")
  if (mode in NOISY_MODES) != (key is not None):
    raise ValueError(f'numerics: the {mode!r} product ' + ('needs a PRNG key' if key is None else
                                                            'takes no PRNG key'))
  resolve_impl(impl, mode=mode)
  out_dtype = jnp.result_type(x, kernel)
  return _emulated(product, x, kernel, mode, key).astype(out_dtype)
