"""The one place JAX's numerics flags are set (`configure`, before any backend starts), and the
record of a run's numerics (`describe`) and processor (`cpu_facts`)."""

import os
import platform as host

import jax
import jax.numpy as jnp

from numerics import formats, ops

# Product format of f32 operands at each legacy level, per platform (docs.jax.dev,
# `jax.lax.Precision` and "Matmul precision"; docs/numerics.md).
NATIVE_FORMAT = {
  'tpu': {'default': 'bf16', 'high': 'bf16_3x', 'highest': 'bf16_6x'},
  'gpu': {'default': 'tf32', 'high': 'tf32', 'highest': 'f32'},
  'cpu': {'default': 'f32', 'high': 'f32', 'highest': 'f32'},
}


def xla_flags(config):
  """The XLA flags this config needs: GPU determinism and `numerics.xla_flags`, in that order."""
  n = config.numerics
  wanted = ['--xla_gpu_deterministic_ops=true'] if n.gpu_deterministic else []
  return wanted + [f for f in n.xla_flags.split() if f not in wanted]


# XLA:CPU's instruction-set levels, lowest first, as --xla_cpu_max_isa names them (jaxlib 0.10.2),
# each with the /proc/cpuinfo flags it needs (and every level below it): docs/numerics.md.
XLA_CPU_ISAS = {
  'SSE4_2': ('sse4_2',),
  'AVX': ('avx',),
  'AVX2': ('avx2',),
  'AVX512': ('avx512f',),
  'AVX512_VNNI': ('avx512_vnni',),
  'AVX512_BF16': ('avx512_bf16',),
  'AMX': ('amx_bf16', 'amx_int8'),
  'AMX_FP16': ('amx_fp16',),
}
MAX_ISA_FLAG = '--xla_cpu_max_isa='
CPUINFO = '/proc/cpuinfo'
X86 = ('x86_64', 'amd64', 'i386', 'i686')

# Global by nature: XLA reads XLA_FLAGS once per process, when its first backend starts.
_applied = None  # the XLA flags configure() set in this process (None: it has not run)


def _missing(wanted):
  """(this process's XLA_FLAGS as a list, the flags of `wanted` not among them)."""
  current = os.environ.get('XLA_FLAGS', '').split()
  return current, [f for f in wanted if f not in current]


def configure(config):
  """Apply a resolved config.numerics before JAX starts: XLA flags (once), matmul precision."""
  global _applied
  wanted = xla_flags(config)
  current, missing = _missing(wanted)
  if missing and _applied is not None:
    raise ValueError(
      f'config.numerics: XLA flag(s) {" ".join(missing)} differ from the flags this '
      f'process already applied ({" ".join(_applied) or "none"}): run '
      'configs with other XLA flags in a process of their own'
    )
  os.environ['XLA_FLAGS'] = ' '.join(current + missing)
  if _applied is None:
    _applied = wanted
  jax.config.update('jax_default_matmul_precision', config.numerics.matmul_precision)


def require_configured(config):
  """ValueError unless this process's XLA_FLAGS hold every flag `config` needs."""
  _, missing = _missing(xla_flags(config))
  if missing:
    raise ValueError(
      f'config.numerics: XLA flag(s) {" ".join(missing)} are not set in this '
      'process: call numerics.setup.configure(config) before JAX starts (train.py '
      'does), or put them in XLA_FLAGS before starting Python'
    )


def precision_scope(config):
  """Context manager: config.numerics.matmul_precision as JAX's default inside it."""
  return jax.default_matmul_precision(config.numerics.matmul_precision)


def with_precision(fn, config):
  """`fn` traced under config.numerics.matmul_precision, keeping fn's name (HLO module names)."""

  def traced(*args, **kwargs):
    with precision_scope(config):
      return fn(*args, **kwargs)

  traced.__name__ = getattr(fn, '__name__', None) or getattr(fn, 'func', fn).__name__
  return traced


def native_formats(platform, precision):
  """(conv format, dot format) of f32 operands under `precision` on `platform`, natively."""
  table = NATIVE_FORMAT.get(platform)
  if table is None:
    return 'unknown', 'unknown'
  if precision in formats.PRESET_FORMAT:
    return table['default'], ('f32' if platform == 'cpu' else formats.PRESET_FORMAT[precision])
  level = table[formats.LEGACY_LEVEL[precision or 'default']]
  return level, level


def effective_formats(platform, precision, requested, compute_dtype='float32', conv_as_dot=False):
  """{'conv', 'dense'} formats the products really run in: 'native' made explicit, bf16 activations
  as 'bf16' (noisy formats aside), emulated f32 on a TPU as 'bf16_6x'."""
  conv, dot = native_formats(platform, precision)
  native = {'conv': dot if conv_as_dot else conv, 'dense': dot}
  out = {}
  for kind in formats.KINDS:
    fmt = requested[kind]
    if fmt != formats.NATIVE and formats.FORMATS[fmt].noisy:
      out[kind] = fmt
    elif compute_dtype == 'bfloat16':
      out[kind] = 'bf16'
    elif fmt == formats.NATIVE:
      out[kind] = native[kind]
    else:
      out[kind] = 'bf16_6x' if (fmt == 'f32' and platform == 'tpu') else fmt
  return out


def describe(config):
  """{'requested': config.numerics, 'effective': the arithmetic in effect on this platform}."""
  n = config.numerics
  device = jax.devices()[0]
  platform = device.platform
  requested = {k: n[k] for k in n.keys()}
  flag = jax.config.jax_default_matmul_precision
  wanted = formats.kind_formats(n)
  conv_impl = ops.resolve_conv_impl(n.conv_impl, platform)
  effective = effective_formats(
    platform, flag, wanted, n.compute_dtype, conv_as_dot=conv_impl == 'im2col'
  )
  if conv_impl == 'im2col' and n.conv_impl == 'auto':
    conv_impl = (
      f'im2col for 1x1 kernels, >= {ops.IM2COL_MIN_MACS} MACs/example and <= 2x2 '
      f'outputs from {ops.IM2COL_SMALL_OUT_MIN_MACS} MACs; xla otherwise'
    )
  flags = os.environ.get('XLA_FLAGS', '')
  return {
    'requested': requested,
    'effective': {
      **requested,
      'platform': platform,
      'device_kind': str(getattr(device, 'device_kind', '')),
      'matmul_precision_flag': str(flag),
      'conv_impl': conv_impl,
      'conv_format': effective['conv'],
      'dense_format': effective['dense'],
      'emulated': {k: wanted[k] != formats.NATIVE for k in formats.KINDS},
      'emulate_impl': {
        k: ops.resolve_impl(n.emulate_impl, platform, wanted[k]) for k in formats.KINDS
      },
      'compute_dtype': str(jnp.dtype(n.compute_dtype)),
      'batchnorm': 'global batch' if not n.batchnorm_group else f'groups of {n.batchnorm_group}',
      'gpu_deterministic': platform == 'gpu' and '--xla_gpu_deterministic_ops=true' in flags,
      'xla_flags': flags,
    },
  }


def cpuinfo(path=CPUINFO):
  """{field: value} of the first processor listed in /proc/cpuinfo; {} where there is none."""
  try:
    with open(path, encoding='utf-8', errors='replace') as f:
      first = f.read().strip().split('\n\n', 1)[0]  # the first processor's block
  except OSError:
    return {}
  fields = [line.partition(':') for line in first.splitlines()]
  return {key.strip(): value.strip() for key, sep, value in fields if sep}


def xla_cpu_isa(cpu_flags, xla_flags):
  """XLA:CPU's XLA_CPU_ISAS level on x86-64 for cpuinfo `cpu_flags`, under a pin; or None."""
  have, levels = set(cpu_flags), []
  for name, needs in XLA_CPU_ISAS.items():
    if not have.issuperset(needs):
      break
    levels.append(name)
  pinned = [f[len(MAX_ISA_FLAG) :].upper() for f in xla_flags.split() if f.startswith(MAX_ISA_FLAG)]
  if pinned and pinned[-1] in levels:
    return pinned[-1]
  return levels[-1] if levels else None


def cpu_facts(xla_flags=None):
  """(model, instruction set, XLA's instruction set) of this host's processor (record.CPU_FACTS)."""
  xla_flags = os.environ.get('XLA_FLAGS', '') if xla_flags is None else xla_flags
  info, machine = cpuinfo(), host.machine().lower()
  flags = info.get('flags', '').split()
  own, xla = (
    (xla_cpu_isa(flags, ''), xla_cpu_isa(flags, xla_flags))
    if machine in X86
    else (machine or None,) * 2
  )
  return info.get('model name') or host.processor() or None, own, xla
