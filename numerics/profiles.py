"""Product formats per kind (convolutions, dense layers) and the named profiles that set them.

A new profile is one function here. `formats(numerics)` is the one answer to "which format does
each kind run in" (the model and `describe()` ask it); `expand(config)` writes it into
conv_format and dense_format when the config is resolved (configs/validation.py, which also
checks the values and refuses a profile contradicted by an explicit format). `upgrade(requested)`
reads records written before the `emulate` field was removed. No JAX here. See docs/numerics.md
("Product formats and profiles").
"""

KINDS = ('conv', 'dense')
UNSET = ''


def native():
  """No emulation: each product as the platform computes it under `numerics.matmul_precision`
  (TPU default: one bf16 pass; A100/H100 default: TF32; CPU: f32 whatever is asked). The arm that
  measures a platform's own arithmetic; it differs between platforms by construction."""
  return 'native', 'native'


def tpu_default():
  """XLA on a TPU at default precision: f32 operands of convolutions and matmuls rounded to bf16,
  products accumulated in f32, one pass. JAX's documentation of `jax.default_matmul_precision`
  and of matmul precision ("Matmul precision", docs.jax.dev) describes the default as the fastest,
  least precise level, computed in bfloat16 on TPU, for dots and convolutions alike."""
  return 'bf16', 'bf16'


def jax_gpu_default():
  """JAX on an A100/H100 at default precision: f32 operands of convolutions and matmuls read as
  TF32 (10 mantissa bits), f32 accumulation. Same JAX sources as `tpu_default`: on recent NVIDIA
  GPUs the default level uses TensorFloat-32 for both kinds of product."""
  return 'tf32', 'tf32'


def torch_gpu_default():
  """PyTorch's defaults on Ampere and newer GPUs (the published GPU arm): convolutions in TF32,
  matmuls (the classifier head) in true f32. PyTorch's CUDA notes ("TensorFloat-32 (TF32) on
  Ampere (and later) devices") say `torch.backends.cudnn.allow_tf32` defaults to True, so cuDNN
  convolutions may use TF32, while `torch.backends.cuda.matmul.allow_tf32` defaults to False since
  PyTorch 1.12, so matmuls stay f32."""
  return 'tf32', 'f32'


def f32():
  """True f32 products everywhere (HIGHEST: f32 on GPU and CPU, six bf16 passes on a TPU, which
  numerics/setup.py records as 'bf16_6x'). IEEE-754 single precision is the common reference."""
  return 'f32', 'f32'


def bf16_noise():
  """The noise control: every operand moved by independent uniform noise of +-1/2 bf16 ulp
  (numerics/emulate.py, rounding.dither_bf16), then an f32 product. The perturbation has the size
  of one-pass bf16 rounding but no systematic part, so the spread of this arm's replicates is the
  noise floor a format's effect is compared with. Keys: numerics/ops.py noise_scope."""
  return 'bf16_noise', 'bf16_noise'


PROFILES = {
  fn.__name__: fn
  for fn in (native, tpu_default, jax_gpu_default, torch_gpu_default, f32, bf16_noise)
}


def _field(numerics, name, default):
  return numerics.get(name, default) if hasattr(numerics, 'get') else default


def named_formats(numerics):
  """{'conv': format, 'dense': format} of config.numerics.profile ({} for none)."""
  profile = _field(numerics, 'profile', UNSET)
  return dict(zip(KINDS, PROFILES[profile](), strict=True)) if profile != UNSET else {}


def formats(numerics):
  """{'conv': format, 'dense': format} that config.numerics asks for: each kind's explicit format,
  else the profile's, else 'native'.

  Works on any mapping with the numerics fields (absent ones count as not given), expanded or not,
  whose values configs/validation.py accepts (an unknown profile is a KeyError here).
  """
  named = named_formats(numerics)
  return {
    kind: _field(numerics, f'{kind}_format', UNSET) or named.get(kind, 'native') for kind in KINDS
  }


def expand(config):
  """Write `formats(config.numerics)` into conv_format / dense_format of the (not yet frozen)
  `config`, in place; returns it. Idempotent: an expanded config expands to itself."""
  resolved = formats(config.numerics)
  for kind in KINDS:
    config.numerics[f'{kind}_format'] = resolved[kind]
  return config


def upgrade(requested):
  """A record's requested numerics (a dict) as today's fields: the removed `emulate` shorthand
  (one format for both kinds; 'none' = not given) becomes the conv_format / dense_format it set,
  where those are not given; nothing else changes. Returns a new dict."""
  out = dict(requested or {})
  mode = out.pop('emulate', None)
  if mode in (None, 'none', UNSET):
    return out
  for kind in KINDS:
    if out.get(f'{kind}_format', UNSET) in (UNSET, None):
      out[f'{kind}_format'] = mode
  return out
