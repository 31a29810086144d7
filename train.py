"""Train a model from a config file: docs/configs.md for the config, docs/operations.md for a run.

  python train.py --config=configs/celeba.py:tpu --workdir=/tmp/run
  python train.py --config=configs/digits.py:smoke --workdir=/tmp/smoke --config.seed=3

Exit codes: 0 done; 1 failed (non-finite values, a failed write: its message says what to do); 2 bad
input, before any compute; 128 + N stopped by signal N (143 SIGTERM, 130 SIGINT, 129 SIGHUP, 138
SIGUSR1), saved: resumable.
"""

import os
import sys

from trainer import process  # no JAX at import: Ctrl-C during start-up is one line

process.install(process.exit_at_once)  # the training loop stops gracefully instead

from absl import app, flags, logging  # noqa: E402 (after the handler: Ctrl-C while importing)

from configs import common  # noqa: E402 (after the handler: Ctrl-C while importing)

CONFIG_HELP = 'Config file[:presets,key=value,...] (configs/celeba.py:gpu,seed=3), then --config.*'
flags.DEFINE_string('config', None, CONFIG_HELP)
flags.DEFINE_string('workdir', None, 'Folder for checkpoints, results and metrics.')
flags.DEFINE_bool('restart', False, 'Discard the run the workdir holds and start over.')
flags.DEFINE_bool('allow_layout_change', False, 'Continue a saved run on other devices.')
FLAGS = flags.FLAGS


def fail(message, code=2, at_once=False):
  """`error: message`, exit `code`; `at_once` skips the shutdown (Orbax's abandoned writes)."""
  logging.flush()
  sys.stdout.flush()
  print(f'error: {message}', file=sys.stderr, flush=True)
  if at_once:
    os._exit(code)
  sys.exit(code)


def main(parsed):
  """The config loaded and resolved once (no JAX yet), the platforms checked, then trained."""
  process.quiet_libraries()
  from configs import validation

  try:
    config = validation.resolve(common.load(*parsed))  # every field checked, frozen
    process.check_platforms()  # before any backend starts
  except ValueError as e:  # a bad file, preset, field, value or platform: one line by design
    fail(str(e))
  from numerics import setup as numerics_setup
  from trainer import checkpoint, metrics, train

  try:
    numerics_setup.configure(config)  # XLA flags before any backend starts (distributed does)
    process.initialize_distributed(config)
    workdir = checkpoint.absolute_workdir(FLAGS.workdir)
    train.train_and_evaluate(config, workdir, FLAGS.restart, FLAGS.allow_layout_change)
  except validation.ConfigError as e:  # bad input found against the devices, data or workdir
    fail(str(e))
  except train.TrainingFailed as e:  # a run that started and stopped: its saved results say why
    fail(str(e), code=1)
  except (checkpoint.CheckpointWriteError, metrics.MetricsWriteError) as e:
    fail(str(e), code=1, at_once=True)
  except RuntimeError as e:  # a backend check_platforms could not see fail (e.g. a driver)
    if 'Unable to initialize backend' not in str(e):
      raise
    fail(str(e).splitlines()[0])
  except process.Stopped as e:  # a signal in the training loop: saved, verified, resumable
    process.exit_stopped(e)


def parse_flags(argv):
  """(config spec, overrides) after absl parses the rest; its errors as one line, exit code 2."""
  if any(a in ('--help', '-h', '--helpfull', '-?') for a in argv[1:]):
    print(__doc__.strip() + '\n\nflags:\n' + FLAGS.main_module_help())
    sys.exit(0)
  spec, overrides, rest = common.split_argv(argv[1:])
  try:
    unparsed = FLAGS(argv[:1] + rest)
  except flags.Error as e:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and 'Pass --help' not in ln]
    fail((lines or [str(e)])[-1].split('Error: ', 1)[-1])
  if len(unparsed) > 1 or not (spec and FLAGS.workdir):
    fail(
      f'give --config and --workdir (and no other arguments: {unparsed[1:]}), e.g. '
      '--config=configs/digits.py:smoke --workdir=runs/smoke'
    )
  return spec, overrides


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
