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
flags.mark_flags_as_required(['config', 'workdir'])
FLAGS = flags.FLAGS


class _QuietLibraries(logging.logging.Filter):
  """Drops INFO records of Orbax's per-save chatter; warnings and errors pass."""

  def filter(self, record):
    return record.levelno >= logging.logging.WARNING or '/orbax/' not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  logging.get_absl_handler().addFilter(_QuietLibraries())
  from trainer import distributed, loop, validation  # after flags: JAX reads XLA_FLAGS at import

  config = FLAGS.config
  try:
    distributed.initialize(config)
    loop.train_and_evaluate(config, FLAGS.workdir)
  except validation.ConfigError as e:
    logging.flush()
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main)
