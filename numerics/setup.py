"""The one place JAX's numerics flags are set, and the record of what a run's numerics were.

`configure(config)` must run before anything is traced (train.py and `train_and_evaluate` call it
first). `describe(config)` returns the requested and the effective settings for the results.
"""

import os

import jax
import jax.numpy as jnp

from numerics import emulate as emulate_lib

PRECISIONS = ('default', 'high', 'highest', 'bfloat16', 'tensorfloat32', 'float32')
DTYPES = ('float32', 'bfloat16')


def validate(config):
  """One-line ValueError naming the field, for any numerics value the code cannot honour."""
  n = config.numerics
  if n.matmul_precision not in PRECISIONS:
    raise ValueError(f'config.numerics.matmul_precision must be one of {PRECISIONS}, '
                     f'got {n.matmul_precision!r}')
  for field in ('compute_dtype', 'param_dtype'):
    if n[field] not in DTYPES:
      raise ValueError(f'config.numerics.{field} must be one of {DTYPES}, got {n[field]!r}')
  if n.emulate not in emulate_lib.EMULATE_MODES:
    raise ValueError(f'config.numerics.emulate must be one of {emulate_lib.EMULATE_MODES}, '
                     f'got {n.emulate!r}')
  if not isinstance(n.batchnorm_group, int) or n.batchnorm_group < 0:
    raise ValueError(f'config.numerics.batchnorm_group must be an int >= 0, got '
                     f'{n.batchnorm_group!r}')


def configure(config):
  """Apply config.numerics to JAX: the default matmul precision and GPU determinism."""
  validate(config)
  jax.config.update('jax_default_matmul_precision', config.numerics.matmul_precision)
  if config.numerics.gpu_deterministic:
    flags = os.environ.get('XLA_FLAGS', '')
    if '--xla_gpu_deterministic_ops' not in flags:
      os.environ['XLA_FLAGS'] = (flags + ' --xla_gpu_deterministic_ops=true').strip()


def describe(config):
  """Requested and effective numerics of this run, JSON-serialisable."""
  n = config.numerics
  platform = jax.devices()[0].platform
  requested = {k: n[k] for k in n.keys()}
  effective = dict(requested)
  effective['platform'] = platform
  effective['matmul_precision_flag'] = str(jax.config.jax_default_matmul_precision)
  effective['compute_dtype'] = str(jnp.dtype(n.compute_dtype))
  effective['xla_flags'] = os.environ.get('XLA_FLAGS', '')
  return {'requested': requested, 'effective': effective}
