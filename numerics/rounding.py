"""Bit-exact round-to-nearest-even of float32 values to bf16 and TF32 (returned as float32), and the
noise control's dither (`dither_bf16`: ±1/2 bf16 ulp of uniform noise, mean zero for every value).

Integer operations on the f32 bit pattern, so the result is the same on every backend; the rules
(subnormals, ties, overflow, inf and NaN) are in docs/numerics.md ("How emulated products are
computed").
"""

import jax
import jax.numpy as jnp
from jax import lax

# Mantissa bits of f32 that each format drops.
DROPPED_BITS = {'bf16': 16, 'tf32': 13}


def round_to_bits(x, dropped):
  """x (float32) rounded to nearest-even with the low `dropped` mantissa bits cleared, as
  float32."""
  x = jnp.asarray(x, jnp.float32)
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  half = jnp.uint32((1 << (dropped - 1)) - 1)  # just under half an ulp of the target format
  lsb = (bits >> jnp.uint32(dropped)) & jnp.uint32(1)  # the kept mantissa's last bit: ties to even
  mask = jnp.uint32((0xFFFFFFFF << dropped) & 0xFFFFFFFF)
  # A carry out of the mantissa increments the exponent, which is exactly right, up to +-inf.
  rounded = (bits + half + lsb) & mask
  out = lax.bitcast_convert_type(rounded, jnp.float32)
  return jnp.where(jnp.isnan(x), x, out)  # nan payloads could otherwise round to inf


def round_bf16(x):
  """x rounded to the nearest bfloat16 (ties to even), as float32."""
  return round_to_bits(x, DROPPED_BITS['bf16'])


def round_tf32(x):
  """x rounded to the nearest TF32 value (10-bit mantissa, ties to even), as float32."""
  return round_to_bits(x, DROPPED_BITS['tf32'])


def split_bf16(x):
  """(hi, lo): hi = bf16(x), lo = bf16(x - hi), the two parts a 3-pass bf16 product multiplies."""
  hi = round_bf16(x)
  return hi, round_bf16(jnp.asarray(x, jnp.float32) - hi)


def split_exact_bf16(x):
  """(hi, lo) with hi + lo == x exactly: hi = x with its low 16 bits cleared (a bf16 value, never
  rounded up, so never past bf16's range), lo = x - hi (exact in f32: hi and x share sign and
  exponent). For x with at most 16 significant bits (TF32's 11 included) lo has at most 8 and is a
  bf16 value too, unless it falls below f32's normal range (|x| < 2^-116 for TF32 values; such an
  lo may be flushed to zero, as XLA:CPU does, leaving hi: within 2^-7 |x| or 2^-133 of x)."""
  x = jnp.asarray(x, jnp.float32)
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  hi = lax.bitcast_convert_type(bits & jnp.uint32(0xFFFF0000), jnp.float32)
  finite = jnp.isfinite(x)
  return jnp.where(finite, hi, x), jnp.where(finite, x - hi, 0.0)  # inf, nan: kept in hi


# Smallest normal f32 exponent's ulp as bf16 sees it: f32 subnormals sit on this grid too.
_BF16_SUBNORMAL_ULP = 2.0**-133


def bf16_ulp(x):
  """The spacing of bf16 values around each |x| (2^(e-7) for x in [2^e, 2^(e+1))), as float32."""
  x = jnp.asarray(x, jnp.float32)
  exponent = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x7F800000)  # 2^e, sign dropped
  power = lax.bitcast_convert_type(exponent, jnp.float32)
  return jnp.maximum(power * 2.0**-7, _BF16_SUBNORMAL_ULP)


def dither_bf16(x, key):
  """x + u * bf16_ulp(x), u ~ Uniform(-1/2, 1/2) drawn from `key` (one draw per element), float32.

  Unbiased (E[result] = x for every x) and with the error distribution that round-to-nearest bf16
  has for a value whose position between two bf16 neighbours is uniform: |error| <= ulp/2, mean
  |error| ulp/4, rms ulp/sqrt(12). The same key gives the same bits. Non-finite values are kept.
  """
  x = jnp.asarray(x, jnp.float32)
  u = jax.random.uniform(key, x.shape, jnp.float32, -0.5, 0.5)
  return jnp.where(jnp.isfinite(x), x + u * bf16_ulp(x), x)
