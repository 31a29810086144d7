"""The platform a step is traced for, where it differs from JAX's default backend.

The platform-dependent choices (numerics/ops.py `resolve_conv_impl`, numerics/emulate.py
`resolve_impl` and `fast_plan`) are made at trace time; trainer/run.py traces every step inside
`scope(<its mesh's platform>)`, so a TPU program compiled on a CPU host makes the TPU's choices
(docs/numerics.md, "Convolutions: xla and im2col").
"""

import contextlib

import jax

_SCOPE: list[str] = []  # the platforms of the open scope()s, innermost last (trace time)


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
