"""Seconds each command takes to answer --help and a bad flag: every module with a `__main__`
block, and train.py, run as a user runs it (`python -m X --help`), a fresh process each time.

  python -m benchmarks.bench_help                # every command, best and median of 3
  python -m benchmarks.bench_help --repeats 5 --commands sweeps.sweep analysis.analyse

Both must come before the heavy libraries load (tests/e2e/test_commands.py checks what loads, not
how long it takes). Prints the environment line and a Markdown table: per command the best and the
median of `--repeats` --help calls, and one call with an unknown flag (its seconds and exit code).
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchmarks import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('analysis', 'benchmarks', 'experiments', 'input_pipeline', 'models', 'sweeps')


def commands():
  """train.py, then every module of PACKAGES with a `__main__` block, by name."""
  found = []
  for package in PACKAGES:
    for where, _, names in sorted(os.walk(os.path.join(REPO, package))):
      for name in sorted(names):
        path = os.path.join(where, name)
        if name.endswith('.py') and "__name__ == '__main__'" in open(path, encoding='utf-8').read():
          found.append(os.path.relpath(path, REPO)[:-3].replace(os.sep, '.'))
  return ['train.py'] + found


def seconds(command, *args):
  """(seconds, exit code) of one fresh `python command args` from the repository root."""
  target = [command] if command.endswith('.py') else ['-m', command]
  start = time.perf_counter()
  proc = subprocess.run(
    [sys.executable, *target, *args], cwd=REPO, capture_output=True, check=False
  )
  return time.perf_counter() - start, proc.returncode


def main(argv=None):
  p = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_help', description=common.description(__doc__)
  )
  p.add_argument('--repeats', type=int, default=3, help='--help calls per command (default 3)')
  p.add_argument(
    '--commands',
    nargs='+',
    default=None,
    help='which commands (module names, or train.py; default: every one)',
  )
  args = p.parse_args(argv)
  if args.repeats < 1:
    common.fail(f'--repeats={args.repeats}: give a positive number')
  print(f'host: {common.host()}')
  print(common.command_line('bench_help', argv))
  print('| command | --help, best (s) | median (s) | a bad flag (s, exit code) |')
  print('|---|---|---|---|')
  for command in args.commands or commands():
    times = [seconds(command, '--help')[0] for _ in range(args.repeats)]
    bad, code = seconds(command, '--no-such-flag')
    shown = f'python {command}' if command.endswith('.py') else f'python -m {command}'
    print(
      f'| `{shown}` | {min(times):.2f} | {statistics.median(times):.2f} | {bad:.2f} ({code}) |',
      flush=True,
    )
  return 0


if __name__ == '__main__':
  sys.exit(main())
