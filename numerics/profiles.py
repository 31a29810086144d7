"""Product formats per kind (convolutions, dense layers) and the named profiles that set them.

Four config.numerics fields say which format the model's products run in:

  profile       a name from PROFILES below ('' = none): sets both formats at once.
  emulate       the older shorthand: one format for both kinds ('none' = not given).
  conv_format   the format of every convolution ('' = as profile / emulate say, else 'native').
  dense_format  the format of every dense layer (the same).

A format is 'native' (whatever the platform does under `matmul_precision`; numerics/setup.py
records which) or one of numerics/emulate.py's modes ('bf16', 'bf16_3x', 'tf32', 'f32',
'bf16_noise'), reproduced on any backend. `formats(numerics)` is the one answer to "which format
does each kind run in"; layers and `describe()` ask it. `expand(config)` writes that answer into
conv_format and dense_format (configs/loader.py and validation call it, so the saved config holds
both the profile name and the formats it stands for); it is idempotent. Settings that disagree (a
profile and a different explicit format, emulate and a different explicit format, a profile and a
different emulate) are a one-line ValueError naming the fields.
"""

from numerics import emulate as emulate_lib

FORMATS = ('native',) + emulate_lib.EMULATE_MODES[1:]  # 'none' is emulate's word for 'native'
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
  mode = _field(numerics, 'emulate', 'none')
  if mode not in emulate_lib.EMULATE_MODES:
    raise ValueError(f'config.numerics.emulate must be one of {emulate_lib.EMULATE_MODES}, got '
                     f'{mode!r}')
  for kind in KINDS:
    value = _field(numerics, f'{kind}_format', UNSET)
    if value != UNSET and value not in FORMATS:
      raise ValueError(f'config.numerics.{kind}_format must be one of {FORMATS} (or empty), got '
                       f'{value!r}')


def _sources(numerics):
  """[(field text, {'conv': fmt, 'dense': fmt})] of every setting that names formats."""
  out = []
  profile = _field(numerics, 'profile', UNSET)
  if profile != UNSET:
    out.append((f'config.numerics.profile={profile!r}', dict(zip(KINDS, PROFILES[profile]()))))
  mode = _field(numerics, 'emulate', 'none')
  if mode != 'none':
    out.append((f'config.numerics.emulate={mode!r}', {'conv': mode, 'dense': mode}))
  return out


def formats(numerics):
  """{'conv': format, 'dense': format} that config.numerics asks for (module doc).

  Works on any mapping with the numerics fields (absent ones count as not given), expanded or not.
  """
  _check_values(numerics)
  sources = _sources(numerics)
  out = {}
  for kind in KINDS:
    given = [(name, f[kind]) for name, f in sources]
    explicit = _field(numerics, f'{kind}_format', UNSET)
    if explicit != UNSET:
      given.append((f'config.numerics.{kind}_format={explicit!r}', explicit))
    for name, value in given[1:]:
      if value != given[0][1]:
        raise ValueError(f'{name} contradicts {given[0][0]} ({kind} format {given[0][1]!r}): '
                         'give one of them, or the same format')
    out[kind] = given[0][1] if given else 'native'
  return out


def expand(config):
  """Write `formats(config.numerics)` into conv_format / dense_format (in place); returns config.

  Idempotent: an expanded config expands to itself.
  """
  resolved = formats(config.numerics)
  for kind in KINDS:
    config.numerics[f'{kind}_format'] = resolved[kind]
  return config


def release(config, fields):
  """Before overrides of `fields` (dotted names) are applied to a possibly expanded config: when
  they set the profile or emulate shorthand but not a kind's format, that kind's format goes back
  to not given if it only repeated what the old shorthands said, so that the new shorthand sets it
  (an explicit, different format stays and is then checked against it)."""
  shorthand = {'numerics.profile', 'numerics.emulate'} & set(fields)
  if not shorthand or 'numerics' not in config:
    return config
  n = config.numerics
  try:
    old = formats({k: n.get(k) for k in ('profile', 'emulate') if k in n})
  except ValueError:
    return config  # not a consistent config: the expansion after the overrides says why
  for kind in KINDS:
    name = f'{kind}_format'
    if f'numerics.{name}' not in fields and n.get(name, UNSET) == old[kind]:
      n[name] = UNSET
  return config

