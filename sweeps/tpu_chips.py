"""One run per TPU chip on one TPU VM (`sweeps.sweep --tpu-chips 0,1,...`).

A process bound to one chip needs libtpu's per-process variables (TPU_VISIBLE_CHIPS,
TPU_PROCESS_BOUNDS, TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_PROCESS_PORT, TPU_PROCESS_ADDRESSES,
CLOUD_TPU_TASK_ID: the ones Google's TPU VM runtime reads), with a port that is a function of the
chip. `python -m sweeps.tpu_chips --chips=0,1,... -- <train.py command>` takes the first chip no
other run on this host holds (an exclusive `flock` on LOCK_DIR/chip<i>, kept until the run exits),
sets them and executes the command. See docs/tpu.md ("One run per chip").
"""

import argparse
import collections
import fcntl
import os
import sys
import time

PORT_BASE = 8476
LOCK_DIR = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'tpu_chips')
VARIABLES = (
  'TPU_VISIBLE_CHIPS',
  'TPU_PROCESS_BOUNDS',
  'TPU_CHIPS_PER_PROCESS_BOUNDS',
  'TPU_PROCESS_PORT',
  'TPU_PROCESS_ADDRESSES',
  'CLOUD_TPU_TASK_ID',
)
POLL_S = 1


class Chip(collections.namedtuple('Chip', 'index')):
  """A slot's TPU chip (sweeps/runner.py hands these out as it hands out GPU ids)."""

  def __str__(self):
    return f'TPU chip {self.index}'


def parse(text):
  """[Chip] of '0,1,2,3' ('' = none); one-line ValueError on a bad or repeated id (a chip cannot
  be shared: libtpu locks it)."""
  try:
    ids = [int(c) for c in (text or '').split(',') if c.strip()]
  except ValueError:
    raise ValueError(
      f'--tpu-chips={text}: give comma-separated chip ids, e.g. --tpu-chips 0,1,2,3'
    ) from None
  if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
    raise ValueError(
      f'--tpu-chips={text}: give each chip id (>= 0) once; two runs cannot share a TPU chip'
    )
  return [Chip(i) for i in ids]


def environment(index):
  """libtpu's per-process variables of a run on chip `index` (module doc)."""
  port = PORT_BASE + index
  return {
    'TPU_VISIBLE_CHIPS': str(index),
    'TPU_PROCESS_BOUNDS': '1,1,1',
    'TPU_CHIPS_PER_PROCESS_BOUNDS': '1,1,1',
    'TPU_PROCESS_PORT': str(port),
    'TPU_PROCESS_ADDRESSES': f'localhost:{port}',
    'CLOUD_TPU_TASK_ID': '0',
  }


def settings(env):
  """'NAME=value ...' of the VARIABLES set in `env` ('' if none): a run's train.log header."""
  return ' '.join(f'{name}={env[name]}' for name in VARIABLES if name in env)


def launcher(chips):
  """The argv prefix that starts a command on the first free one of `chips` (module doc)."""
  return [
    'python',
    '-m',
    'sweeps.tpu_chips',
    f'--chips={",".join(str(c.index) for c in chips)}',
    '--',
  ]


def claim(chips, lock_dir=LOCK_DIR, poll_s=POLL_S):
  """(chip index, open lock descriptor) of the first of `chips` no other process holds, waiting
  while all are held."""
  os.makedirs(lock_dir, exist_ok=True)
  while True:
    for chip in chips:
      fd = os.open(os.path.join(lock_dir, f'chip{chip.index}'), os.O_RDWR | os.O_CREAT, 0o666)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return chip.index, fd
      except BlockingIOError:
        os.close(fd)
    time.sleep(poll_s)


def parse_args(argv):
  # The standard library only: the launcher runs under whichever `python` the command list names.
  p = argparse.ArgumentParser(
    prog='python -m sweeps.tpu_chips',
    description="Run a command on the first free TPU chip of --chips with libtpu's "
    'per-process variables (one run per chip of a TPU VM; the lines sweeps.sweep '
    '--tpu-chips emits).',
  )
  p.add_argument(
    '--chips',
    required=True,
    help='comma-separated ids of the chips this host may hand out, e.g. 0,1,2,3',
  )
  p.add_argument(
    'command',
    nargs=argparse.REMAINDER,
    help='the command, after --, e.g. -- python train.py --config=...',
  )
  p.error = lambda message: fail(f'{message}; see --help')
  args = p.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ['--'] else args.command
  if not command:
    fail('give the command after --, e.g. -- python train.py --config=...; see --help')
  return args.chips, command


def fail(message):
  """One line `error: ...` on stderr, exit code 2 (analysis/cli.py's form, without its imports)."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv=None):
  """`python -m sweeps.tpu_chips --chips=0,1,... -- COMMAND...`: COMMAND on a free chip."""
  text, command = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    chips = parse(text)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  index, fd = claim(chips)
  os.set_inheritable(fd, True)  # the command holds the chip's lock until it exits
  os.environ.update(environment(index))
  print(f'tpu_chips: {settings(os.environ)}', flush=True)
  if command[0] == 'python':  # the command list's `python`: this interpreter
    command = [sys.executable, *command[1:]]
  os.execvp(command[0], command)
  return 0  # not reached


if __name__ == '__main__':
  sys.exit(main())
