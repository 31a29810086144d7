"""Whether the platforms JAX_PLATFORMS names can start on this host, checked before any backend
starts (train.py, the sweep's checks and its --dry-run), and the memory devices report
(`device_memory`: trainer/run.py checks a config against it). Standard library only: importing it
starts nothing.

JAX starts every platform JAX_PLATFORMS names (comma-separated) and fails with a 30-line traceback
when one cannot start. What each needs, as JAX finds it: 'cpu' nothing; 'tpu' the libtpu package;
'cuda' (and 'gpu', which means CUDA or ROCm) a PJRT plugin (jax[cuda12]: the 'jax_plugins' entry
point or namespace package) and, for CUDA, an NVIDIA driver on the host; 'rocm' its plugin. What
this cannot see (a driver that fails to start) still ends as one line: train.py turns JAX's
"Unable to initialize backend" into one. See docs/operations.md ("Installing").
"""

import importlib.metadata
import importlib.util
import os
import pkgutil

KNOWN = ('cpu', 'gpu', 'cuda', 'rocm', 'tpu')
NVIDIA_DRIVER = ('/proc/driver/nvidia/version', '/dev/nvidiactl')


def requested(environ=os.environ):
  """The platforms JAX_PLATFORMS names, in order ([] when unset or empty: JAX picks)."""
  return [p.strip() for p in environ.get('JAX_PLATFORMS', '').split(',') if p.strip()]


def plugins():
  """Names of the installed JAX PJRT plugins (e.g. 'xla_cuda12'), as JAX discovers them."""
  names = [e.name for e in importlib.metadata.entry_points(group='jax_plugins')]
  if importlib.util.find_spec('jax_plugins') is not None:
    import jax_plugins

    names += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
  return names


def nvidia_driver():
  """Whether an NVIDIA driver is visible on this host."""
  return any(os.path.exists(path) for path in NVIDIA_DRIVER)


def gpu_runs(environ=os.environ):
  """Whether a run started with `environ` can use a GPU (for GPU-only settings)."""
  names = requested(environ)
  wants = not names or any(p in ('gpu', 'cuda', 'rocm') for p in names)
  return wants and any('cuda' in p or 'rocm' in p for p in plugins())


def _missing(platform):
  """Why `platform` cannot start here, or None."""
  if platform not in KNOWN:
    return f'{platform!r} is not a JAX platform (choose from {", ".join(KNOWN)})'
  installed = plugins()
  if platform == 'tpu' and importlib.util.find_spec('libtpu') is None:
    return "'tpu' needs the TPU runtime (pip install 'jax[tpu]'), which is not installed"
  if platform in ('gpu', 'cuda', 'rocm'):
    kinds = ('cuda', 'rocm') if platform == 'gpu' else (platform,)
    found = [k for k in kinds if any(k in p for p in installed)]
    if not found:
      return (
        f'{platform!r} needs a JAX GPU plugin (pip install "jax[cuda12]"), which is not installed'
      )
    if found == ['cuda'] and not nvidia_driver():
      return f'{platform!r} needs an NVIDIA GPU and driver, and this host shows none'
  return None


def check(environ=os.environ):
  """One-line ValueError when a platform JAX_PLATFORMS names cannot start on this host."""
  for platform in requested(environ):
    why = _missing(platform)
    if why:
      raise ValueError(
        f'JAX_PLATFORMS={environ["JAX_PLATFORMS"]}: {why}: unset JAX_PLATFORMS '
        '(JAX then picks what the host has) or name a platform it has, e.g. cpu'
      )


def memory_stat(devices, key):
  """`key` of each device's memory_stats() (e.g. 'bytes_limit'), for the devices reporting it."""
  values = []
  for device in devices:
    try:
      stats = device.memory_stats()
    except Exception:  # backends without memory statistics (each raises its own kind)
      stats = None
    if stats and stats.get(key) is not None:
      values.append(int(stats[key]))
  return values


def device_memory(devices):
  """The smallest `bytes_limit` the devices report, or None when none reports one (CPU)."""
  limits = [v for v in memory_stat(devices, 'bytes_limit') if v]
  return min(limits) if limits else None
