"""JAX's GPU memory settings: the environment variables its GPU backend reads when it starts (JAX's
"GPU memory allocation" docs), and the one-line record of those an environment sets (a sweep's
train.log header, a benchmark's environment line). Standard library only: importing it starts
nothing. See docs/performance.md ("GPU memory")."""

import os

MEMORY_VARIABLES = (
  'XLA_PYTHON_CLIENT_PREALLOCATE',
  'XLA_PYTHON_CLIENT_MEM_FRACTION',
  'XLA_PYTHON_CLIENT_ALLOCATOR',
)
JAX_DEFAULT = "JAX's default (a GPU preallocates 75 %)"


def memory_settings(env=os.environ, separator=', ', none=JAX_DEFAULT):
  """'NAME=value' of each MEMORY_VARIABLES entry set in `env`, joined by `separator`; `none` if
  none is set."""
  found = [f'{name}={env[name]}' for name in MEMORY_VARIABLES if name in env]
  return separator.join(found) if found else none
