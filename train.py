"""Train ResNet-18 from a config file; see README.md.

  python train.py --config=configs/celeba.py:tpu --workdir=/tmp/run
  python train.py --config=configs/digits.py:smoke --workdir=/tmp/smoke --config.seed=3

Exit codes: 0 done; 1 the run failed (non-finite values, a write failed: its message says what to
do); 2 bad input, found before any compute; 128 + N stopped by signal N (SIGTERM 143, SIGINT 130)
after saving a checkpoint: the same command resumes.
"""

import os
import sys

from trainer import stop  # imports no JAX: installed first, Ctrl-C during start-up is one line

stop.install(stop.exit_at_once)  # the training loop stops gracefully instead (trainer/stop.py)

# pylint: disable=wrong-import-position
from absl import app, flags, logging  # noqa: E402

from configs import loader  # noqa: E402

flags.DEFINE_string('config', None, 'Config file, optionally with presets and key=value pairs '
                    'after a colon (e.g. configs/celeba.py:gpu,seed=3); any field can then be '
                    'set as --config.<field>=<value>.')
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, results and metrics (a relative '
                    'path is taken from the current directory).')
flags.DEFINE_bool('restart', False, 'Discard the run the workdir holds (a different config, or a '
                  'failed run) and start over. Without it such a workdir is refused.')
flags.DEFINE_bool('allow_layout_change', False, 'Continue a saved run on another device layout '
                  '(device count, process count, platform or device kind); the results then '
                  'record each segment. Without it such a resume is refused.')
FLAGS = flags.FLAGS
CONFIG = {}  # 'spec' and 'overrides' from the command line (split off before absl parses it)


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


class _QuietLibraries(logging.logging.Filter):
  """Drops Orbax's per-save INFO chatter, and the tracebacks its background threads and asyncio
  tasks log when a write fails: Orbax re-raises those failures in the main thread, where they
  become one line. Drops JAX's own INFO lines too (on a CPU machine, 'Unable to initialize backend
  tpu' at every start); its warnings (e.g. a GPU present without a CUDA jaxlib) stay."""

  def filter(self, record):
    if record.name.startswith('jax.') and record.levelno < logging.logging.WARNING:
      return False
    return not _from_orbax(record) or (record.levelno >= logging.logging.WARNING
                                       and not record.exc_info)


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

  def on_unraisable(info, previous=sys.unraisablehook, closed_loop=_closed_loop,
                    orbax=_orbax_coroutine):
    if not (closed_loop(info.exc_value) or orbax(info.object)):
      previous(info)
  sys.excepthook, sys.unraisablehook = on_exception, on_unraisable


def fail(message, code=2, at_once=False):
  """Print one line and exit `code`: 2 for bad input (before any compute), 1 for a failed run.

  `at_once`: skip the interpreter's shutdown (after a failed write, Orbax's abandoned asynchronous
  tasks print hundreds of lines of "Event loop is closed" there; nothing is left to save).
  """
  logging.flush()
  print(f'error: {message}', file=sys.stderr)
  if at_once:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def absolute_workdir(workdir):
  """Local paths made absolute once, here (Orbax refuses relative ones); gs:// etc. unchanged."""
  return workdir if '://' in workdir else os.path.abspath(os.path.expanduser(workdir))


def load_config():
  """The config from --config and --config.* (configs/loader.py), resolved once
  (trainer/validation.resolve), or a one-line exit."""
  from trainer import platforms, validation  # pylint: disable=import-outside-toplevel
  if not CONFIG.get('spec'):
    fail('--config: give a config file, e.g. --config=configs/digits.py:smoke')
  if not FLAGS.workdir:
    fail('--workdir: give a folder for the run, e.g. --workdir=runs/smoke')
  try:
    config = loader.load(CONFIG['spec'], CONFIG['overrides'])
  except ValueError as e:
    fail(str(e).splitlines()[0])
  except Exception as e:  # pylint: disable=broad-except  # the config file's own code failed
    first = str(e).splitlines()[0] if str(e) else ''
    fail(f'--config={CONFIG["spec"]}: {type(e).__name__}: {first}; fix the config file or the '
         'value given')
  try:
    resolved = validation.resolve(config)
    platforms.check()  # JAX_PLATFORMS can start here: before any backend does
    return resolved
  except ValueError as e:  # ConfigError is a ValueError
    fail(str(e).splitlines()[0])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  logging.get_absl_handler().addFilter(_QuietLibraries())
  quiet_abandoned_work()
  train(load_config())


def train(config):
  """train_and_evaluate of the resolved `config`, its failures as one line and an exit code (see
  the module docstring)."""
  from numerics import setup as numerics_setup  # pylint: disable=import-outside-toplevel
  from trainer import checkpointing, distributed, loop, reporting, validation  # pylint: disable=import-outside-toplevel
  try:
    numerics_setup.configure(config)  # XLA flags before any backend starts (distributed does)
    distributed.initialize(config)
    loop.train_and_evaluate(config, absolute_workdir(FLAGS.workdir), restart=FLAGS.restart,
                            allow_layout_change=FLAGS.allow_layout_change)
  except validation.ConfigError as e:
    fail(str(e))
  except ValueError as e:  # numerics.setup.configure: one line naming the field
    fail(str(e).splitlines()[0])
  except loop.TrainingFailed as e:
    fail(str(e), code=1)  # a run that started and stopped: its saved results say why
  except (checkpointing.CheckpointWriteError, reporting.MetricsWriteError) as e:
    fail(str(e), code=1, at_once=True)
  except RuntimeError as e:
    if 'Unable to initialize backend' not in str(e):
      raise
    fail(str(e).splitlines()[0])  # a platform platforms.check could not see fail (a driver)
  except stop.Stopped as e:  # SIGTERM/SIGINT in the training loop: saved, resumable
    logging.flush()
    print(f'stopped: {e}', file=sys.stderr)
    sys.exit(e.exit_code)


def parse_flags(argv):
  """absl flag parsing after the --config flags are split off; errors as one line, exit code 2."""
  if any(a in ('--help', '-h', '--helpfull', '-?') for a in argv[1:]):
    print(__doc__.strip() + '\n\nflags:\n' + FLAGS.main_module_help())
    sys.exit(0)
  CONFIG['spec'], CONFIG['overrides'], rest = loader.split_argv(argv[1:])
  try:
    return FLAGS(argv[:1] + rest)
  except flags.Error as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    lines = [l for l in lines if not l.startswith('Pass --help')] or [str(e)]
    fail(lines[-1].split('Error: ', 1)[-1])


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
