"""The number formats a product can be emulated in (`FORMATS`, one entry each), the profiles that
map product kinds to formats (`PROFILES`), the config.numerics values. JAX-free at import."""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

NATIVE = 'native'  # a product as the platform computes it: not emulated, not in FORMATS
KINDS = ('conv', 'dense')  # the model's product kinds, each with its own format
UNSET = ''

# jax_default_matmul_precision: the legacy levels (each with its level's name), and the
# DotAlgorithmPreset names that take f32 operands (each with its dots' format; convs ignore them).
LEGACY_LEVEL = {
  'default': 'default',
  'high': 'high',
  'highest': 'highest',
  'bfloat16': 'default',
  'tensorfloat32': 'high',
  'float32': 'highest',
}
PRESET_FORMAT = {
  'BF16_BF16_F32': 'bf16',
  'BF16_BF16_F32_X3': 'bf16_3x',
  'BF16_BF16_F32_X6': 'bf16_6x',
  'BF16_BF16_F32_X9': 'bf16_9x',
  'TF32_TF32_F32': 'tf32',
  'TF32_TF32_F32_X3': 'tf32_3x',
  'F32_F32_F32': 'f32',
}
PRESET_PRECISIONS = tuple(PRESET_FORMAT)
PRECISIONS = (*LEGACY_LEVEL, *PRESET_FORMAT)
DTYPE_BYTES = {'float32': 4, 'bfloat16': 2}  # numerics.compute_dtype, param_dtype: bytes a value
DTYPES = tuple(DTYPE_BYTES)
CONV_IMPLS = ('auto', 'xla', 'im2col')  # numerics.conv_impl (numerics/ops.py)
EMULATE_IMPLS = ('auto', 'reference', 'fast')  # numerics.emulate_impl (numerics/ops.py)


def round_to_bits(x, dropped):
  """f32 `x` rounded to nearest-even with its low `dropped` mantissa bits cleared, by integer
  operations on the bit pattern: the same on every backend."""
  import jax.numpy as jnp
  from jax import lax

  x = jnp.asarray(x, jnp.float32)
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  half = jnp.uint32((1 << (dropped - 1)) - 1)  # just under half an ulp of the target format
  lsb = (bits >> jnp.uint32(dropped)) & jnp.uint32(1)  # the kept mantissa's last bit: ties to even
  mask = jnp.uint32((0xFFFFFFFF << dropped) & 0xFFFFFFFF)
  # A carry out of the mantissa increments the exponent, which is exactly right, up to +-inf.
  out = lax.bitcast_convert_type((bits + half + lsb) & mask, jnp.float32)
  return jnp.where(jnp.isnan(x), x, out)  # nan payloads could otherwise round to inf


def round_bf16(x):
  """x rounded to the nearest bfloat16 (ties to even), as f32."""
  return round_to_bits(x, 16)


def round_tf32(x):
  """x rounded to the nearest TF32 value (10-bit mantissa, ties to even), as f32."""
  return round_to_bits(x, 13)


def split_bf16(x):
  """(hi, lo): hi = bf16(x), lo = bf16(x - hi), the parts a 3-pass bf16 product multiplies."""
  import jax.numpy as jnp

  hi = round_bf16(x)
  return hi, round_bf16(jnp.asarray(x, jnp.float32) - hi)


def split_exact_bf16(x):
  """(hi, lo), hi + lo == x exactly, hi = x with its low 16 bits cleared: both bf16 values for x of
  at most 16 significant bits (lo may flush to zero below f32's normal range, as on XLA:CPU)."""
  import jax.numpy as jnp
  from jax import lax

  x = jnp.asarray(x, jnp.float32)
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  hi = lax.bitcast_convert_type(bits & jnp.uint32(0xFFFF0000), jnp.float32)
  finite = jnp.isfinite(x)
  return jnp.where(finite, hi, x), jnp.where(finite, x - hi, 0.0)  # inf, nan: kept in hi


def dither_bf16(x, key):
  """x + u * ulp, u ~ Uniform(-1/2, 1/2) per element from `key`, ulp the bf16 spacing at |x|:
  unbiased, with the error distribution of round-to-nearest bf16; non-finite values kept."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  x = jnp.asarray(x, jnp.float32)
  exponent = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x7F800000)  # 2^e, sign dropped
  ulp = jnp.maximum(lax.bitcast_convert_type(exponent, jnp.float32) * 2.0**-7, 2.0**-133)
  u = jax.random.uniform(key, x.shape, jnp.float32, -0.5, 0.5)
  return jnp.where(jnp.isfinite(x), x + u * ulp, x)


@dataclasses.dataclass(frozen=True)
class FastPlan:
  """The fast form of a format's parts: as `dtype` at `precision`; `split`: as bf16 hi/lo."""

  dtype: str
  precision: str
  split: bool = False


@dataclasses.dataclass(frozen=True)
class Format:
  """One emulated number format of a product's operands, accumulated in f32."""

  description: str  # one line: what it is, and which hardware computes it so
  operands: Callable[[Any, Any], list]  # (f32 array, PRNG key or None) -> its parts, f32 values
  passes: tuple[tuple[int, int], ...]  # (i, j): part i of x times part j of the kernel, in order
  fast: Mapping[str, FastPlan] | None = None  # platform -> the fast form; None: reference only
  noisy: bool = False  # its operands need a PRNG key (numerics/ops.py noise_key)


ONE_PASS = ((0, 0),)
THREE_PASSES = ((0, 1), (1, 0), (0, 0))  # hi/lo parts: small terms first, as XLA's X3
ON_BF16_UNITS = FastPlan('bfloat16', 'DEFAULT')

FORMATS: dict[str, Format] = {
  'bf16': Format(
    'operands rounded to bf16, one pass: a TPU at default precision',
    lambda a, key: [round_bf16(a)],
    ONE_PASS,
    fast={'cpu': ON_BF16_UNITS, 'gpu': ON_BF16_UNITS, 'tpu': ON_BF16_UNITS},
  ),
  'bf16_3x': Format(
    'operands split into bf16 hi + lo, three passes: a TPU at high precision',
    lambda a, key: list(split_bf16(a)),
    THREE_PASSES,
    fast={'cpu': ON_BF16_UNITS, 'gpu': ON_BF16_UNITS, 'tpu': ON_BF16_UNITS},
  ),
  'tf32': Format(
    'operands rounded to TF32 (10 mantissa bits), one pass: an A100/H100 at default precision',
    lambda a, key: [round_tf32(a)],
    ONE_PASS,
    fast={
      'gpu': FastPlan('float32', 'DEFAULT'),  # TF32 tensor cores on exact TF32 operands
      'tpu': FastPlan('bfloat16', 'DEFAULT', split=True),  # 4 exact bf16 passes
      'cpu': FastPlan('float32', 'HIGHEST'),  # no TF32 unit: the reference's product
    },
  ),
  'f32': Format('operands kept in f32, one pass at HIGHEST', lambda a, key: [a], ONE_PASS),
  'bf16_noise': Format(
    'the noise control: operands moved by uniform noise of +-1/2 bf16 ulp, then an f32 product',
    lambda a, key: [dither_bf16(a, key)],
    ONE_PASS,
    noisy=True,
  ),
}


def names():
  """Every value a `<kind>_format` field takes: 'native' and the FORMATS, read when called."""
  return (NATIVE, *FORMATS)


@dataclasses.dataclass(frozen=True)
class Profile:
  """A named arithmetic: the format of each product kind, and where it comes from."""

  conv: str
  dense: str
  description: str


PROFILES = {
  'native': Profile(
    NATIVE,
    NATIVE,
    'No emulation: each product as the platform computes it under numerics.matmul_precision (TPU '
    'default: one bf16 pass; A100/H100 default: TF32; CPU: f32 whatever is asked). The arm that '
    "measures a platform's own arithmetic; it differs between platforms by construction.",
  ),
  'tpu_default': Profile(
    'bf16',
    'bf16',
    'XLA on a TPU at default precision: f32 operands of convolutions and matmuls rounded to bf16, '
    'products accumulated in f32, one pass. JAX documents `jax.default_matmul_precision` and '
    '"Matmul precision" (docs.jax.dev): the default is the fastest, least precise level, bfloat16 '
    'on TPU, for dots and convolutions alike.',
  ),
  'jax_gpu_default': Profile(
    'tf32',
    'tf32',
    'JAX on an A100/H100 at default precision: f32 operands of convolutions and matmuls read as '
    'TF32 (10 mantissa bits), f32 accumulation: on recent NVIDIA GPUs the default level uses '
    'TensorFloat-32 for both kinds of product (the JAX sources of tpu_default).',
  ),
  'torch_gpu_default': Profile(
    'tf32',
    'f32',
    "PyTorch's defaults on Ampere and newer GPUs (the published GPU arm): convolutions in TF32, "
    'matmuls (the head) in true f32. PyTorch\'s CUDA notes ("TensorFloat-32 (TF32) on Ampere (and '
    'later) devices"): torch.backends.cudnn.allow_tf32 defaults to True, '
    'torch.backends.cuda.matmul.allow_tf32 to False since PyTorch 1.12.',
  ),
  'f32': Profile(
    'f32',
    'f32',
    'True f32 products everywhere (HIGHEST: f32 on GPU and CPU, six bf16 passes on a TPU, which '
    "the record names 'bf16_6x'). IEEE-754 single precision is the common reference.",
  ),
  'bf16_noise': Profile(
    'bf16_noise',
    'bf16_noise',
    'The noise control: every operand moved by independent uniform noise of +-1/2 bf16 ulp, then '
    'an f32 product: the size of one-pass bf16 rounding without its systematic part, so the '
    "spread of this arm's replicates is the noise floor a format's effect is compared with.",
  ),
}


def profile_formats(numerics):
  """{'conv': format, 'dense': format} of config.numerics.profile ({} for none)."""
  profile = numerics.get('profile', UNSET)
  if profile == UNSET:
    return {}
  return {kind: getattr(PROFILES[profile], kind) for kind in KINDS}


def kind_formats(numerics):
  """{'conv': format, 'dense': format} config.numerics asks for: explicit, else the profile's."""
  named = profile_formats(numerics)
  return {kind: numerics.get(f'{kind}_format', UNSET) or named.get(kind, NATIVE) for kind in KINDS}


def expand(config):
  """Write kind_formats(config.numerics) into the (not yet frozen) `config`; returns it."""
  for kind, fmt in kind_formats(config.numerics).items():
    config.numerics[f'{kind}_format'] = fmt
  return config


def upgrade(requested):
  """A record's requested numerics with the removed `emulate` shorthand as the formats it set."""
  out = dict(requested or {})
  mode = out.pop('emulate', None)
  if mode in (None, 'none', UNSET):
    return out
  for kind in KINDS:
    if out.get(f'{kind}_format', UNSET) in (UNSET, None):
      out[f'{kind}_format'] = mode
  return out
