"""The platform a computation is traced for, where it differs from JAX's default backend.

Choices that depend on the platform (numerics/ops.py `resolve_conv_impl`, numerics/emulate.py
`resolve_impl` and `fast_plan`) are made while the model is traced. A step traced for devices of
another platform than this process's default backend (a TPU program compiled ahead of time on a
CPU host, sweeps/preflight.py) must make them for that platform: trainer/run.py traces every step
inside `scope(<the platform of its mesh's devices>)` (numerics/setup.py `with_precision`), so a
real run and a compile-only one make the same choices for the same devices.
"""

import contextlib

import jax

_SCOPE = []  # the platforms of the open scope()s, innermost last (trace time)


@contextlib.contextmanager
def scope(platform):
  """Inside: `current()` is `platform` ('cpu', 'gpu', 'tpu'; None leaves it unchanged)."""
  _SCOPE.append(platform or current())
  try:
    yield
  finally:
    _SCOPE.pop()


def current():
  """The platform being traced for: the innermost scope's, else JAX's default backend."""
  return _SCOPE[-1] if _SCOPE else jax.default_backend()
