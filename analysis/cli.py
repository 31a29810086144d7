"""What the analysis command lines share (analysis.analyse, attribute, draw,
analysis.export): bad input as `error: ...` lines on stderr with exit code 2 and no traceback, the
--margin flag, and output that prints under any locale.

  args = cli.Parser(prog='python -m analysis.x').parse_args(argv)   # argparse, errors as above
  cli.locale_proof()                                              # '±' under LC_ALL=C
  except ValueError as e: cli.fail(e)
Reference: docs/statistics.md "Commands".
"""

import argparse
import contextlib
import os
import sys
import threading
import time

from analysis import declaration, output


def fail(message, code=2):
  """Print each line of `message` as 'error: LINE' on stderr (the last line is one too) and exit
  `code` (2: bad input; 1: the output could not be written, output.WriteFailed)."""
  for line in str(message).splitlines() or ['']:
    print(f'error: {line}', file=sys.stderr)
  sys.exit(code)


@contextlib.contextmanager
def destination(target, folder=True, flag='--out'):
  """analysis/output.py's Destination of `target`, held while inside (None when `target` is
  None: the command writes nothing); refused in one line (fail) when another command holds it or
  it cannot be written. Inside, a ValueError is one line, exit 2, and a WriteFailed one, exit 1:
  nothing is written either way."""
  dest = None
  try:
    if target:
      dest = output.Destination(target, folder, flag).__enter__()
    yield dest
  except output.WriteFailed as e:
    fail(e, code=1)
  except ValueError as e:
    fail(e)
  finally:
    if dest is not None:
      dest.__exit__(None, None, None)


class Parser(argparse.ArgumentParser):
  """argparse whose errors are one `error: ...` line (exit 2), not its usage block."""

  def error(self, message):
    fail(f'{message}; see --help')


def number_flag(problem_of):
  """An argparse type: the number in the text (kept as text when it is none), refused with the
  one line `problem_of(value)` gives (None: a usable value)."""

  def parse(text):
    try:
      value = float(text)
    except ValueError:
      value = text
    problem = problem_of(value)
    if problem:
      raise argparse.ArgumentTypeError(problem)
    return value

  return parse


def factor_problem(value):
  """Why `value` is not a --scale factor: a finite number above 0 (0 or -100 turn every accuracy
  into 0 or its negative; inf and nan into no number)."""
  real = isinstance(value, float) and value == value and 0 < value < float('inf')
  return (
    None
    if real
    else (
      f'{value!r} is not a factor; give a positive number, e.g. 100 '
      '(fractions to percent) or 1 (already in percent)'
    )
  )


# --margin (declaration.margin_problem), --min-share (declaration.share_problem:
# in (0, 1]), --scale (factor_problem)
margin_flag = number_flag(declaration.margin_problem)
share_flag = number_flag(declaration.share_problem)
scale_flag = number_flag(factor_problem)


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
