"""Bit-exact round-to-nearest-even of float32 values to narrower formats, returned as float32.

Written with integer operations on the f32 bit pattern (`lax.bitcast_convert_type`), so the result
is the same on CPU, GPU and TPU, whatever the backend does with bf16 casts or denormals:

  bf16: 8-bit exponent, 7-bit mantissa (keeps the top 16 bits of an f32).
  tf32: 8-bit exponent, 10-bit mantissa (keeps the top 19 bits of an f32).

Both formats share f32's exponent range, so f32 subnormals round on the same uniform grid (gradual
underflow, as `ml_dtypes.bfloat16` does), ties go to the even mantissa, values at or past the
midpoint above the largest finite value overflow to +-inf, +-inf stay +-inf and nan stays nan.
"""

import jax.numpy as jnp
from jax import lax

# Mantissa bits of f32 that each format drops.
DROPPED_BITS = {'bf16': 16, 'tf32': 13}


def round_to_bits(x, dropped):
  """x (float32) rounded to nearest-even with the low `dropped` mantissa bits cleared, as float32."""
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
