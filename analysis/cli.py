"""What the analysis command lines share (analysis.analyse, attribute, draw,
analysis.export): bad input as `error: ...` lines on stderr with exit code 2 and no traceback, the
--margin flag, and output that prints under any locale.

  args = cli.Parser(prog='python -m analysis.x').parse_args(argv)   # argparse, errors as above
  cli.locale_proof()                                              # '±' under LC_ALL=C
  except ValueError as e: cli.fail(e)
"""

import argparse
import contextlib
import os
import sys
import threading
import time

from analysis.inputs import declaration


def fail(message):
  """Print each line of `message` as 'error: LINE' on stderr (the last line is one too) and exit 2."""
  for line in str(message).splitlines() or ['']:
    print(f'error: {line}', file=sys.stderr)
  sys.exit(2)


class Parser(argparse.ArgumentParser):
  """argparse whose errors are one `error: ...` line (exit 2), not its usage block."""

  def error(self, message):
    fail(f'{message}; see --help')


def margin_flag(text):
  """argparse type of --margin: the number in `text`, refused as declaration.margin_problem says."""
  try:
    value = float(text)
  except ValueError:
    value = text
  problem = declaration.margin_problem(value)
  if problem:
    raise argparse.ArgumentTypeError(problem)
  return value


def add_margin_argument(parser, help_text):
  parser.add_argument('--margin', type=margin_flag, default=None, help=help_text)


def check_out_folder(path):
  """Raise a ValueError naming --out when `path` exists and is not a folder (checked before any
  compute: the report would be computed, then fail to be written)."""
  if path and os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f'--out: {path} is a file; give a folder (it is created when missing)')


def locale_proof():
  """Let stdout and stderr print any text under any locale: a character the locale's encoding
  lacks ('±', 'Δ' under LC_ALL=C) is printed as a backslash escape instead of raising
  UnicodeEncodeError. Files are written as UTF-8 whatever the locale (encoding='utf-8')."""
  for stream in (sys.stdout, sys.stderr):
    if hasattr(stream, 'reconfigure'):
      stream.reconfigure(errors='backslashreplace')


@contextlib.contextmanager
def stage(command, what, quiet_s=2.0, every_s=10.0):
  """Progress on stderr (stdout holds the report) for a stage that lasts: nothing if it ends
  within `quiet_s` (a quick run, or bad input found at once, stays one `error:` line), else
  'COMMAND: WHAT...', then every `every_s` 'COMMAND: WHAT: N s', and at its end
  'COMMAND: WHAT: done in N s'."""
  start, done, shown = time.time(), threading.Event(), []

  def beat():
    if done.wait(quiet_s):
      return
    shown.append(True)
    print(f'{command}: {what}...', file=sys.stderr, flush=True)
    while not done.wait(every_s):
      print(f'{command}: {what}: {time.time() - start:.0f} s', file=sys.stderr, flush=True)
  thread = threading.Thread(target=beat, daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
  if shown:
    print(f'{command}: {what}: done in {time.time() - start:.1f} s', file=sys.stderr, flush=True)
