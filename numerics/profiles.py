"""Product formats per kind (convolutions, dense layers) and the named profiles that set them.

Three config.numerics fields say which format the model's products run in, one per choice:

  profile       a name from PROFILES below ('' = none): both formats at once.
  conv_format   the format of every convolution ('' = as the profile says, else 'native').
  dense_format  the format of every dense layer (the same).

A format is 'native' (whatever the platform does under `matmul_precision`; numerics/setup.py
records which) or one of numerics/emulate.py's FORMATS ('bf16', 'bf16_3x', 'tf32', 'f32',
'bf16_noise'), reproduced on any backend. `formats(numerics)` is the one answer to "which format
does each kind run in"; the model and `describe()` ask it. `expand(config)` writes that answer
into conv_format and dense_format; trainer/validation.resolve calls it once, before the config is
frozen, so the saved config holds both the profile name and the formats it stands for. A profile
and a different explicit format are a one-line ValueError naming both fields.

Records written before `emulate` (one format for both kinds, 'none' = native) was removed are read
through `upgrade(requested)`, the one place that knows the old field.
"""

from numerics import emulate as emulate_lib

FORMATS = emulate_lib.FORMATS
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


PROFILES = {fn.__name__: fn for fn in (native, tpu_default, jax_gpu_default, torch_gpu_default,
                                       f32, bf16_noise)}


def _field(numerics, name, default):
  return numerics.get(name, default) if hasattr(numerics, 'get') else default


def _check_values(numerics):
  """One-line ValueError for a value no format field can hold."""
  profile = _field(numerics, 'profile', UNSET)
  if profile != UNSET and profile not in PROFILES:
    raise ValueError(f'config.numerics.profile must be one of {tuple(PROFILES)} (or empty), got '
                     f'{profile!r}')
  for kind in KINDS:
    value = _field(numerics, f'{kind}_format', UNSET)
    if value != UNSET and value not in FORMATS:
      raise ValueError(f'config.numerics.{kind}_format must be one of {FORMATS} (or empty), got '
                       f'{value!r}')


def formats(numerics):
  """{'conv': format, 'dense': format} that config.numerics asks for (module doc).

  Works on any mapping with the numerics fields (absent ones count as not given), expanded or not.
  """
  _check_values(numerics)
  profile = _field(numerics, 'profile', UNSET)
  named = dict(zip(KINDS, PROFILES[profile]())) if profile != UNSET else {}
  out = {}
  for kind in KINDS:
    explicit = _field(numerics, f'{kind}_format', UNSET)
    if explicit != UNSET and kind in named and explicit != named[kind]:
      raise ValueError(f'config.numerics.{kind}_format={explicit!r} contradicts '
                       f'config.numerics.profile={profile!r} ({kind} format {named[kind]!r}): '
                       'give one of them, or the same format')
    out[kind] = explicit if explicit != UNSET else named.get(kind, 'native')
  return out


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
