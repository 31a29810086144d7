"""What the runner reads of a run while it trains: the end of its log (the last line of a failed
run, the `step s/T` counter) and the speeds of its logged training records.
"""

import os
import re

from analysis.inputs import results

STEP_COUNTER = re.compile(r'step (\d+)/(\d+)')


def tail(path, size=8192):
  """The last `size` bytes of a text file as text ('' if unreadable)."""
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, os.path.getsize(path) - size))
      return f.read().decode(errors='replace')
  except OSError:
    return ''


def last_line(path):
  """The last non-empty line of a log file ('' if none)."""
  lines = [line.strip() for line in tail(path).splitlines() if line.strip()]
  return lines[-1] if lines else ''


def logged_speeds(workdir):
  """[(step, images/s)] of the training records in the run's metrics.jsonl (results.train_records;
  [] if the file cannot be read)."""
  try:
    return [
      (int(e['step']), float(e['images_per_sec']))
      for e in results.train_records(workdir)
      if e.get('images_per_sec')
    ]
  except OSError:
    return []


def total_steps(logfile):
  """The run's total steps from the last `step s/T` counter of its log, or None."""
  found = STEP_COUNTER.findall(tail(logfile))
  return int(found[-1][1]) if found else None
