"""Train ResNet-18 from a config file; see README.md.

  python train.py --config=configs/celeba.py:tpu --workdir=/tmp/run
  python train.py --config=configs/digits.py:smoke --workdir=/tmp/smoke --config.seed=3
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file('config', None, 'Config file, optionally with presets after a '
                                'colon (e.g. configs/celeba.py:gpu).', lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, results and metrics.')
flags.DEFINE_bool('restart', False, 'Discard the run the workdir holds (a different config, or a '
                  'failed run) and start over. Without it such a workdir is refused.')
flags.mark_flags_as_required(['config', 'workdir'])
FLAGS = flags.FLAGS


class _QuietLibraries(logging.logging.Filter):
  """Drops INFO records of Orbax's per-save chatter; warnings and errors pass."""

  def filter(self, record):
    return record.levelno >= logging.logging.WARNING or '/orbax/' not in record.pathname


def fail(message, code=2):
  """Print one line and exit `code`: 2 for bad input (before any compute), 1 for a failed run."""
  logging.flush()
  print(f'error: {message}', file=sys.stderr)
  sys.exit(code)


def config_error_line(error):
  """One line out of ml_collections' multi-line config loading errors."""
  if isinstance(error, (AttributeError, KeyError)):
    name = str(error).strip('"\'')
    return f'unknown config field {name!r}: check the --config.<field> overrides'
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  detail = next((l for l in reversed(lines) if 'Errno' in l or 'Error' in l), lines[-1])
  return f'--config could not be loaded: {detail}'


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  logging.get_absl_handler().addFilter(_QuietLibraries())
  from trainer import checkpointing, distributed, loop, validation  # after flags: JAX reads XLA_FLAGS

  try:
    config = FLAGS.config
    config.get('seed')  # a config that failed to load raises only when first used
  except (OSError, AttributeError, KeyError, ValueError, TypeError) as e:
    fail(config_error_line(e))
  try:
    distributed.initialize(config)
    loop.train_and_evaluate(config, FLAGS.workdir, restart=FLAGS.restart)
  except validation.ConfigError as e:
    fail(str(e))
  except (loop.TrainingFailed, checkpointing.CheckpointWriteError) as e:
    fail(str(e), code=1)  # a run that started and stopped: its saved results say why


def parse_flags(argv):
  """absl flag parsing, with a config or flag error reduced to one line and exit code 2."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    lines = [l for l in lines if not l.startswith('Pass --help')] or [str(e)]
    fail(lines[-1].split('Error: ', 1)[-1])
  except (AttributeError, KeyError, OSError, ValueError, TypeError) as e:
    fail(config_error_line(e))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
