"""The values the config.numerics fields take: product formats, matmul precisions, dtypes and the
two implementation choices. No JAX here: the config checks (configs/validation.py) and the analysis
read them without loading a backend; docs/numerics.md says what each means."""

FORMATS = ('native', 'bf16', 'bf16_3x', 'tf32', 'f32', 'bf16_noise')  # 'native': not emulated
NOISY_FORMATS = ('bf16_noise',)  # these need a PRNG key
FAST_FORMATS = ('bf16', 'bf16_3x', 'tf32')  # the formats with a faster exact form

# jax_default_matmul_precision: the legacy levels, and the DotAlgorithmPreset names that take f32
# operands (they set dots only: convolutions ignore them).
LEGACY_PRECISIONS = ('default', 'high', 'highest', 'bfloat16', 'tensorfloat32', 'float32')
PRESET_PRECISIONS = (
  'BF16_BF16_F32',
  'BF16_BF16_F32_X3',
  'BF16_BF16_F32_X6',
  'BF16_BF16_F32_X9',
  'TF32_TF32_F32',
  'TF32_TF32_F32_X3',
  'F32_F32_F32',
)
PRECISIONS = LEGACY_PRECISIONS + PRESET_PRECISIONS
DTYPE_BYTES = {'float32': 4, 'bfloat16': 2}  # numerics.compute_dtype, param_dtype: bytes a value
DTYPES = tuple(DTYPE_BYTES)
CONV_IMPLS = ('auto', 'xla', 'im2col')  # numerics.conv_impl (numerics/ops.py)
EMULATE_IMPLS = ('auto', 'reference', 'fast')  # numerics.emulate_impl (numerics/emulate.py)
