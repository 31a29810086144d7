"""What train.py silences: library chatter and the tracebacks of work Orbax abandons, each failure
being reported once, as one line, in the main thread (train.py's `fail`).

  quiet.install()   # absl's handler filtered (QuietLibraries), the exception hooks wrapped

See docs/operations.md ("A training run": exit codes and one-line errors).
"""

import logging as std_logging
import os
import sys

from absl import logging


def _from_orbax(record):
  """Whether a log record comes from Orbax: its own modules, or an asyncio task of one."""
  if '/orbax/' in record.pathname:
    return True
  if record.name != 'asyncio':
    return False
  trace = record.exc_info[2] if record.exc_info else None
  while trace is not None:
    if '/orbax/' in trace.tb_frame.f_code.co_filename:
      return True
    trace = trace.tb_next
  return '/orbax/' in record.getMessage()


class QuietLibraries(std_logging.Filter):
  """Drops Orbax's per-save INFO chatter, and the tracebacks its background threads and asyncio
  tasks log when a write fails: Orbax re-raises those failures in the main thread, where they
  become one line. Drops JAX's own INFO lines too (on a CPU machine, 'Unable to initialize backend
  tpu' at every start); its warnings (e.g. a GPU present without a CUDA jaxlib) stay."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.name.startswith('jax.') and record.levelno < std_logging.WARNING:
      return False
    return not _from_orbax(record) or (
      record.levelno >= std_logging.WARNING and not record.exc_info
    )


def _closed_loop(exc):
  return isinstance(exc, RuntimeError) and str(exc) == 'Event loop is closed'


def _orbax_coroutine(obj):
  code = getattr(obj, 'cr_code', None)
  return code is not None and '/orbax/' in code.co_filename


def quiet_abandoned_work():
  """Drop what Orbax's abandoned asynchronous work prints through sys.excepthook and
  sys.unraisablehook (from its threads, and at interpreter shutdown); Orbax reports the failure
  itself, once, in the main thread, where it becomes one line:
  - after a failed write, tensorstore's callbacks into Orbax's closed event loop;
  - after a failed restore, the other arrays' reads it leaves pending: when such a coroutine is
    closed, Orbax's `except BaseException` in serialization.py turns the GeneratorExit into an
    Exception with the whole TensorStore spec (~65 lines each, one per array in flight).
  The hooks hold what they call (no module globals: they also run while the interpreter shuts
  down)."""

  def on_exception(kind, exc, trace, previous=sys.excepthook, closed_loop=_closed_loop):
    if not closed_loop(exc):
      previous(kind, exc, trace)

  def on_unraisable(
    info, previous=sys.unraisablehook, closed_loop=_closed_loop, orbax=_orbax_coroutine
  ):
    if not (closed_loop(info.exc_value) or orbax(info.object)):
      previous(info)

  sys.excepthook, sys.unraisablehook = on_exception, on_unraisable


def install():
  """Quiet the libraries (QuietLibraries on absl's handler, TensorFlow's C++ INFO lines unless set)
  and Orbax's abandoned work (quiet_abandoned_work)."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  logging.get_absl_handler().addFilter(QuietLibraries())
  quiet_abandoned_work()
