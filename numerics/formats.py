"""The names of the product formats numerics/emulate.py reproduces (no JAX here: the analysis reads
them from run records without loading a backend)."""

FORMATS = ('native', 'bf16', 'bf16_3x', 'tf32', 'f32', 'bf16_noise')  # 'native': not emulated
NOISY_FORMATS = ('bf16_noise',)  # these need a PRNG key
FAST_FORMATS = ('bf16', 'bf16_3x', 'tf32')  # the formats with a faster exact form
