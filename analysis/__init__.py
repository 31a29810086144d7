"""Statistics, attribution, reports and figures over the runs' Orbax results (reading only)."""

import sys

if sys.argv[:1] == ['-m']:  # `python -m analysis.<command>` is being found: its flags first, so that
  from analysis import arguments  # --help and a bad flag come before its heavy imports
  arguments.early()
