"""Statistics, attribution, reports and figures over the runs' Orbax results (reading only)."""

import sys

# `python -m analysis.<command>` is being found: its flags are parsed first, so that --help and a
# bad flag come before the command's heavy imports (analysis/arguments.py).
if sys.argv[:1] == ['-m']:
  from analysis import arguments

  arguments.early()
