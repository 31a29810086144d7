"""A run's test predictions as the analysis reads them: those of the checkpoint step its results
came from, or a reason why the run has none to give (runrecord/predictions.py owns the item).

  pred, why = read(run, step=44, test_size=360)   # (the item, None) or (None, 'why not')
  got = read_runs(runs)                           # the same for each row of a runs table

The agreement, calibration and per-class sections (analysis/numbers/agreement_section.py) compare
the models whose accuracy the report states; a run's accuracy is its results' final evaluation,
saved at the results' step, so its predictions are those of that step: never the newest step that
happens to hold some (an older evaluation's, when the final step's item is missing), which would
pair one model's accuracy with another model's predictions. A run left out says why, one of:

  NONE_SAVED     no step holds predictions (a CSV's rows, or a run written before runs saved them)
  NOT_AT_STEP    other steps hold predictions, its results' step none
  NO_STEP        its results name no step
  DAMAGED        the item at its step cannot be read (a truncated or missing file: Orbax's error
                 in the reason), or does not hold the arrays its task needs, of one length, the
                 test split's size (data.test_size) and fingerprint (data.split_fingerprint)
                 where the record gives them

Only these sections leave the run out: its accuracy, the tests and the verdict keep it.
Reference: docs/record.md "Test predictions".
"""

import logging
import math
import os
import sys
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from runrecord import predictions

if TYPE_CHECKING:  # the runs table's type, for the annotations only
  import pandas as pd

NONE_SAVED = 'no predictions saved'
NOT_AT_STEP = "no predictions at its results' step"
NO_STEP = 'its results name no step'
DAMAGED = 'predictions item damaged'
# What `read` gives: (the predictions item, None), or (None, why the run has none to compare).
Read = tuple[Optional[dict[str, Any]], Optional[str]]


def kind(reason):
  """The kind of a reason `read` gives (the text before its details): what the summary counts."""
  return str(reason).split(' (', 1)[0]


def known(value):
  """`value` as an int, or None when missing (None, NaN)."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return None
  return int(value)


def item_problem(pred, test_size=None, fingerprint=None):
  """Why the predictions item `pred` cannot be compared example by example (None: it can): its
  task's arrays (predictions.KEYS) present, of one length, that length the test split's size, its
  test split the record's (`fingerprint`: data.split_fingerprint; None: not recorded)."""
  task = pred.get('task')
  if task not in predictions.KEYS:
    return f'task {task!r} is neither of {", ".join(predictions.KEYS)}'
  absent = [k for k in predictions.KEYS[task] if k not in pred]
  if absent:
    return f'no {", ".join(absent)} array'
  lengths = {k: len(np.asarray(pred[k])) for k in predictions.KEYS[task]}
  if len(set(lengths.values())) > 1:
    return 'arrays of different lengths (' + ', '.join(f'{k} {n}' for k, n in lengths.items()) + ')'
  n = next(iter(lengths.values()))
  if test_size is not None and n != test_size:
    return f'{n} examples, the test split has {test_size}'
  saved = str(pred.get('fingerprint') or '')
  if fingerprint and saved and saved != str(fingerprint):
    return f'the predictions of test split {saved}, the results of {fingerprint}'
  return None


DAMAGED_FOLDERS: set[str] = set()  # the run folders whose item failed to read (quiet_failed_reads)


class _FailedReads(logging.Filter):
  """Drops asyncio's 'Task exception was never retrieved' records about a folder in
  DAMAGED_FOLDERS (Orbax's other restore tasks of that item, failing the same way later)."""

  def filter(self, rec):
    text = str(rec.exc_info[1]) if rec.exc_info else rec.getMessage()
    return not any(folder in text for folder in DAMAGED_FOLDERS)


def quiet_failed_reads(run):
  """After a failed read of run folder `run`, TensorStore's pending callbacks and Orbax's other
  tasks fail too, seconds later, for a run the analysis has already left out with its reason:
  Python prints 'RuntimeError: Event loop is closed' through sys.unraisablehook and asyncio logs
  'Task exception was never retrieved' with the same error, each with a traceback. Drop exactly
  those (every other unraisable error and log record is printed as before)."""
  DAMAGED_FOLDERS.add(os.path.abspath(str(run)))
  asyncio_log = logging.getLogger('asyncio')
  if not any(isinstance(f, _FailedReads) for f in asyncio_log.filters):
    asyncio_log.addFilter(_FailedReads())
  previous = sys.unraisablehook
  if getattr(previous, 'drops_closed_loops', False):
    return

  def hook(unraisable):
    if not (
      isinstance(unraisable.exc_value, RuntimeError)
      and str(unraisable.exc_value) == 'Event loop is closed'
    ):
      previous(unraisable)

  hook.drops_closed_loops = True
  sys.unraisablehook = hook


def read(run: str, step: Any, test_size: Any = None, fingerprint: Any = None) -> Read:
  """(predictions dict, None) of run folder `run` at checkpoint `step` (its results' step), or
  (None, reason): see the module doc. `test_size`, `fingerprint`: data.test_size and
  data.split_fingerprint of its record (None: unknown)."""
  step, test_size = known(step), known(test_size)
  fingerprint = None if fingerprint is None or fingerprint != fingerprint else fingerprint
  if step is None:
    return None, NO_STEP
  try:
    steps = predictions.saved_steps(run)
  except OSError as e:
    return None, f'{DAMAGED} ({type(e).__name__}: {e})'
  if not steps:
    return None, NONE_SAVED
  if step not in steps:
    return None, f'{NOT_AT_STEP} ({step}; the newest at step {steps[-1]}: an older evaluation)'
  try:
    pred = predictions.read_predictions(run, step)
  except Exception as e:  # Orbax/TensorStore's own error types
    quiet_failed_reads(run)
    first = (str(e).strip().splitlines() or [''])[0][:200]
    return None, f'{DAMAGED} (step {step}: {type(e).__name__}: {first})'
  problem = item_problem(pred, test_size, fingerprint)
  return (None, f'{DAMAGED} (step {step}: {problem})') if problem else (pred, None)


def read_runs(runs: 'pd.DataFrame') -> list[Read]:
  """[(predictions, None) or (None, why)] of each row of the runs table `runs` (read): its run
  folder `run` at its results' `step`, checked against its data.test_size and
  data.split_fingerprint where the table has them."""

  def column(name):
    return runs[name] if name in runs else [None] * len(runs)

  return [
    read(*row)
    for row in zip(
      runs['run'],
      column('step'),
      column('data.test_size'),
      column('data.split_fingerprint'),
      strict=True,
    )
  ]
