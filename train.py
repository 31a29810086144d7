"""Train ResNet-18 from a config file: docs/configs.md for the config, docs/operations.md for a run.

  python train.py --config=configs/celeba.py:tpu --workdir=/tmp/run
  python train.py --config=configs/digits.py:smoke --workdir=/tmp/smoke --config.seed=3

Exit codes: 0 done; 1 failed (non-finite values, a failed write: its message says what to do); 2 bad
input, before any compute; 128 + N stopped by signal N (143 SIGTERM, 130 SIGINT), saved: resumable.
"""

import os
import sys

from trainer import stop  # imports no JAX: installed first, Ctrl-C during start-up is one line

stop.install(stop.exit_at_once)  # the training loop stops gracefully instead (trainer/stop.py)

from absl import app, flags, logging  # noqa: E402 (after stop.install: Ctrl-C while importing)

from configs import loader  # noqa: E402 (after stop.install: Ctrl-C while importing)

flags.DEFINE_string(
  'config',
  None,
  'Config file, with presets and key=value pairs after a colon '
  '(e.g. configs/celeba.py:gpu,seed=3); then any --config.<field>=<value>.',
)
flags.DEFINE_string('workdir', None, 'Folder for checkpoints, results and metrics.')
flags.DEFINE_bool(
  'restart',
  False,
  'Discard the run the workdir holds (another config, or a '
  'failed run) and start over; without it such a workdir is refused.',
)
flags.DEFINE_bool(
  'allow_layout_change',
  False,
  'Continue a saved run on another device layout '
  '(devices, processes, platform or device kind); without it that is refused.',
)
FLAGS = flags.FLAGS


def fail(message, code=2, at_once=False):
  """`error: message`, exit `code` (2 bad input, 1 a failed run); `at_once` skips the shutdown
  (after a failed write, Orbax's abandoned tasks print hundreds of lines there)."""
  logging.flush()
  sys.stdout.flush()
  print(f'error: {message}', file=sys.stderr, flush=True)
  if at_once:
    os._exit(code)
  sys.exit(code)


def main(parsed):
  """The config resolved once, JAX_PLATFORMS checked, then train; bad input: one line, exit 2."""
  from trainer import platforms, quiet

  quiet.install()
  try:
    loaded = loader.load(*parsed)  # a bad file, preset or field: answered before JAX loads
    from configs import validation  # numpy and the vocabularies, not JAX: after --help

    config = validation.resolve(loaded)  # every field checked, frozen
    platforms.check()  # before any backend starts
  except ValueError as e:  # a bad file, preset, field or value; ConfigError is a ValueError
    fail(str(e).splitlines()[0])
  train(config)


def train(config):
  """train_and_evaluate of the resolved `config`; failures as one line and an exit code."""
  from numerics import setup as numerics_setup
  from trainer import checkpointing, distributed, loop, workdirs, writers

  try:
    numerics_setup.configure(config)  # XLA flags before any backend starts (distributed does)
    distributed.initialize(config)
    loop.train_and_evaluate(
      config,
      workdirs.absolute_workdir(FLAGS.workdir),
      restart=FLAGS.restart,
      allow_layout_change=FLAGS.allow_layout_change,
    )
  except ValueError as e:  # ConfigError, and numerics.setup.configure's: one line
    fail(str(e).splitlines()[0])
  except loop.TrainingFailed as e:
    fail(str(e), code=1)  # a run that started and stopped: its saved results say why
  except (checkpointing.CheckpointWriteError, writers.MetricsWriteError) as e:
    fail(str(e), code=1, at_once=True)
  except RuntimeError as e:  # a backend platforms.check could not see fail (e.g. a driver)
    if 'Unable to initialize backend' not in str(e):
      raise
    fail(str(e).splitlines()[0])
  except stop.Stopped as e:  # SIGTERM/SIGINT in the training loop: saved, resumable
    logging.flush()
    print(f'stopped: {e}', file=sys.stderr)
    sys.exit(e.exit_code)


def parse_flags(argv):
  """(config spec, overrides) after absl parses the rest; its errors as one line, exit code 2."""
  if any(a in ('--help', '-h', '--helpfull', '-?') for a in argv[1:]):
    print(__doc__.strip() + '\n\nflags:\n' + FLAGS.main_module_help())
    sys.exit(0)
  spec, overrides, rest = loader.split_argv(argv[1:])
  try:
    unparsed = FLAGS(argv[:1] + rest)
  except flags.Error as e:
    lines = [
      line.strip() for line in str(e).splitlines() if line.strip() and 'Pass --help' not in line
    ]
    fail((lines or [str(e)])[-1].split('Error: ', 1)[-1])
  if len(unparsed) > 1 or not (spec and FLAGS.workdir):
    fail(
      f'give --config and --workdir (and no other arguments: {unparsed[1:]}), e.g. '
      '--config=configs/digits.py:smoke --workdir=runs/smoke'
    )
  return spec, overrides


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
