"""A CSV of results entering the analysis (read_csv): which of its columns are read, and what it
must satisfy before anything is computed from it.

Columns read (read_columns): all but those no analysis reads, so that 100,000 runs in
analysis.export's 105-column format stay small: the final.* metrics other than the analysed one
and the config fields that cannot change a result (runrecord.record.IGNORED_FIELDS: cadence, paths,
distributed), unless named (--group-by, --factors, the declared factors). The file is read in
chunks of CHUNK_ROWS rows, so the parser's buffers stay bounded, and its text columns (config,
numerics, data, versions: a few values repeated over every run) are kept as pandas categoricals.

Read as (read_columns): surrounding spaces of text cells dropped ('f32 ' is 'f32'), the platform
names as JAX spells them (analysis/inputs/columns.py normalise_platforms: 'GPU ' is 'gpu'; a note
on stderr says so), and a run met twice (rows with one `run_id`, analysis.export's column, and the
same values in every other column read, the `run` path aside: an export of a root and of its copy
or bind mount, concatenated) counted once, with a note.

Checks (check): a wrong value here silently changes a verdict, so each one is refused with one
line naming the column, the line of the file and the fix.

  metric column   numbers (a text value is refused, an empty cell is a run with no value: excluded
                  and listed), finite; an accuracy (a column named *acc*) in [0, 1] or [0, 100] and
                  on one scale: fractions (0 < v <= 1) and percents (1 < v <= 100) never mixed (3
                  percent rows among fractions would switch the whole analysis to percent; a real
                  0.8 % among percents is read as one with --scale 1, which declares the scale);
                  a loss (*loss*) >= 0. Only the completed runs are checked (status 'completed', or
                  every row without a status column): the others are excluded anyway.
  other numbers   the columns read beside the metric (final.train_loss for the loss table, the
                  final test accuracy beside it): the same rules.
  platform        no empty cell, no two names that differ only in case (columns.platform_problems).
  test set        one per data config (columns.test_set_problems).
  run             each run id once, none empty (a repeated id is two values of one run, not two
                  replicates); rows sharing a `run_id` with different values are one run holding
                  two records: refused, naming both lines.
  seed            whole numbers ('abc' would merge its runs into one seed); an empty seed is a
                  run of its own (analysis.analyse) but refused where every run needs its seed
                  (analysis.numbers.attribution: the seed is the model's group), but for runs
                  that are not completed.

Lines are the file's (the header is line 1). At most MAX_LINES problems are listed, then a count.
Reference: docs/statistics.md "Input the analysis refuses".
"""

import collections
import os
import sys
from collections.abc import Sequence
from typing import Optional, Union

import numpy as np
import pandas as pd

from analysis.inputs import columns
from analysis.inputs.columns import resolve_column
from runrecord import record

MAX_LINES = 10
CHUNK_ROWS = 20_000
# read whatever the analysed metric: the final training loss is reported per arm beside it
# (analysis/numbers/calibration.py loss_table)
ALWAYS_READ = ('final.train_loss',)
# Numeric columns checked as the metric is, whenever they are read (the loss table's).
CHECKED = ('final.train_loss', 'final.test_loss', record.DEFAULT_METRIC)
ID = 'run_id'  # runrecord/record.py's run identity, as analysis.export writes it


def unused(column, metric, names):
  """Whether no analysis of `metric` (a column name, or None: every metric kept) and of the
  columns `names` (as given: 'compute_dtype' or a full column name) reads `column`."""
  if column in names or column == metric or column in ALWAYS_READ:
    return False
  if column.startswith('final.'):
    return metric is not None
  field = column[len(record.CONFIG_PREFIX) :]
  return column.startswith(record.CONFIG_PREFIX) and any(
    field == f or field.startswith(f + '.') for f in record.IGNORED_FIELDS
  )


def compact(chunk, plain):
  """The chunk with its text columns but `plain` as pandas categoricals (one copy of each distinct
  value and a small code per row: the config, numerics, data and versions columns repeat a few
  values over every run)."""
  for column in chunk.columns:
    if column not in plain and not pd.api.types.is_numeric_dtype(chunk[column]):
      chunk[column] = chunk[column].astype('category')
  return chunk


def join(chunks):
  """The chunks as one table: a column categorical in every chunk stays categorical (over the
  union of the chunks' values), any other is concatenated as pandas reads it."""
  columns = {}
  for name in chunks[0].columns:
    parts = [chunk[name] for chunk in chunks]
    if all(isinstance(part.dtype, pd.CategoricalDtype) for part in parts):
      columns[name] = pd.Series(
        pd.api.types.union_categoricals(parts, ignore_order=True), name=name
      )
    else:
      columns[name] = pd.concat(
        [
          part.astype(object) if isinstance(part.dtype, pd.CategoricalDtype) else part
          for part in parts
        ],
        ignore_index=True,
      )
  return pd.DataFrame(columns)


def read_columns(path, header, metric=None, names=(), seed='seed'):
  """The table in the CSV at `path` (whose header is `header`), only its columns that are used
  (unused; `metric`: the metric's column), read CHUNK_ROWS rows at a time, each chunk's text
  columns made categorical (compact) but the run, its status and reason, the metric and `seed`."""
  keep = [c for c in header if not unused(c, metric, set(names))]
  plain = {'run', ID, 'status', 'reason', metric, seed}
  frame = join(
    [compact(chunk, plain) for chunk in pd.read_csv(path, usecols=keep, chunksize=CHUNK_ROWS)]
  )
  frame, notes = columns.normalise_platforms(frame)  # first: its notes name the cells as written
  frame = strip_text(frame)
  frame, once = one_per_run(frame)
  for note in notes + once:
    print(f'note: --csv {path}: {note}', file=sys.stderr)
  return frame


def strip_text(frame):
  """`frame` with surrounding spaces dropped from its categorical (text) cells: 'f32 ' would be an
  arm of its own. Only the distinct values are looked at."""
  for name in frame.columns:
    values = frame[name]
    if isinstance(values.dtype, pd.CategoricalDtype):
      cats = list(values.cat.categories)
      stripped = [c.strip() if isinstance(c, str) else c for c in cats]
      if stripped != cats:
        frame[name] = (
          values.astype(object)
          .map(lambda v: v.strip() if isinstance(v, str) else v)
          .astype('category')
        )
  return frame


def one_per_run(frame):
  """(frame, notes): rows sharing a `run_id` whose other columns but `run` hold the same values
  kept once (one run met twice); rows sharing one that differ are left for check to refuse."""
  if ID not in frame or not frame[ID].notna().any():
    return frame, []
  ids = frame[ID].astype(object)
  repeated = ids.notna() & ids.duplicated(keep=False)
  if not repeated.any():
    return frame, []
  others = [c for c in frame.columns if c != 'run']
  content = frame.loc[repeated, others].astype(str)
  same = content.drop_duplicates()
  if same[ID].duplicated().any():  # an id with two contents: check() refuses it
    return frame, []
  drop = content.index.difference(same.index)

  def lines_of(i):
    return ', '.join(map(str, line_numbers(ids.index[ids == frame.at[i, ID]])))

  notes = [
    f'run id {frame.at[i, ID]} on lines {lines_of(i)}: '
    'one run met twice (the same values): counted once'
    for i in same.index
  ]
  return frame.drop(index=drop), notes


line_numbers = columns.line_numbers
completed_rows = columns.completed_rows


def accuracy_scale_problems(column, numbers):
  """One line per row on the minority scale when fractions and percents are mixed."""
  fractions = numbers[(numbers > 0) & (numbers <= 1)]
  percents = numbers[(numbers > 1) & (numbers <= 100)]
  if fractions.empty or percents.empty:
    return []
  if len(percents) <= len(fractions):
    odd, fix = percents, f'in percent while {len(fractions)} rows are fractions: divide it by 100'
  else:  # a percent at most 1 is possible (a run at 0.8 %): say how to keep it
    odd, fix = (
      fractions,
      (
        f'at most 1 while {len(percents)} rows are in percent: a fraction? '
        'multiply it by 100; a real percent below 1? give --scale 1 (the column '
        'is in percent)'
      ),
    )
  return [
    f'{column}, line {n}: {v:g} is {fix} (one scale for the whole column)'
    for n, v in zip(line_numbers(odd.index), odd, strict=True)
  ]


def metric_problems(frame, column, scale=None):
  """The metric column's problems (see the module doc), one line each; `scale` (--scale: the
  factor to percent the user declared) replaces the scale rule: value x scale in [0, 100]."""
  values = frame.loc[completed_rows(frame), column]
  numbers = pd.to_numeric(values, errors='coerce')
  text = values[values.notna() & numbers.isna()]
  lines = [
    f'{column}, line {n}: {v!r} is not a number; write the number, or leave the cell empty '
    'to exclude the run'
    for n, v in zip(line_numbers(text.index), text, strict=True)
  ]
  numbers = numbers.dropna().astype(float)
  infinite = numbers[~np.isfinite(numbers)]
  lines += [
    f"{column}, line {n}: {v} is not finite; write the run's value, or leave the cell "
    'empty to exclude the run'
    for n, v in zip(line_numbers(infinite.index), infinite, strict=True)
  ]
  numbers = numbers[np.isfinite(numbers)]
  kind = (
    'an accuracy' if 'acc' in column.lower() else 'a loss' if 'loss' in column.lower() else None
  )
  if kind:
    low = numbers[numbers < 0]
    lines += [
      f'{column}, line {n}: {v:g} is negative, and {kind} is >= 0; correct the value'
      for n, v in zip(line_numbers(low.index), low, strict=True)
    ]
  if kind == 'an accuracy' and scale is not None:
    high = numbers[numbers * scale > 100]
    return lines + [
      f'{column}, line {n}: {v:g} x --scale {scale:g} is above 100 %; correct the value or --scale'
      for n, v in zip(line_numbers(high.index), high, strict=True)
    ]
  if kind == 'an accuracy':
    high = numbers[numbers > 100]
    lines += [
      f'{column}, line {n}: {v:g} is above 100; an accuracy is a fraction in [0, 1] or a '
      'percent in [0, 100]: correct the value'
      for n, v in zip(line_numbers(high.index), high, strict=True)
    ]
    lines += accuracy_scale_problems(column, numbers)
  return lines


def identity_problems(frame):
  """One line per `run_id` held by rows with different values (one_per_run kept them)."""
  if ID not in frame:
    return []
  ids = frame[ID].astype(object)
  repeated = ids[ids.notna() & ids.duplicated(keep=False)]
  lines = []
  for run_id, rows in repeated.groupby(repeated, sort=False):
    places = ', '.join(
      f'line {n}' + (f' ({frame.at[i, "run"]})' if 'run' in frame else '')
      for n, i in zip(line_numbers(rows.index), rows.index, strict=True)
    )
    lines.append(
      f'{ID}: run id {run_id!r} holds different values on {places}: one run with two '
      'records (a copy taken at another step?); keep the one you mean'
    )
  return lines


def run_id_problems(frame):
  """One line per run id that appears on more than one line, and per empty run id."""
  if 'run' not in frame:
    return []
  empty = frame['run'].isna()
  lines = [
    f'run, line {n}: the run id is empty; give each run its own id'
    for n in line_numbers(frame.index[empty])
  ]
  runs = frame.loc[~empty, 'run'].astype(str)
  repeated = runs[runs.duplicated(keep=False)]
  return lines + [
    f'run, lines {", ".join(map(str, line_numbers(rows.index)))}: run id {run!r} appears '
    f'{len(rows)} times; give each run its own id (runs of one seed are replicates only '
    'under different ids)'
    for run, rows in repeated.groupby(repeated, sort=False)
  ]


def seed_problems(frame, column, required):
  """One line per seed that is not a whole number, or (`required`) is missing on a completed run."""
  values = frame[column]
  numbers = pd.to_numeric(values, errors='coerce')
  whole = numbers.notna() & np.isfinite(numbers) & (numbers == np.floor(numbers))
  bad = values.notna() & ~whole
  empty = values.isna() & completed_rows(frame) & required
  lines = [
    f"{column}, line {n}: {v!r} is not a whole-number seed; write the run's integer seed"
    for n, v in zip(line_numbers(values[bad].index), values[bad], strict=True)
  ]
  return lines + [
    f"{column}, line {n}: the seed is empty; write the run's integer seed (the "
    'attribution groups runs by seed)'
    for n in line_numbers(values[empty].index)
  ]


def check(frame, path, metric=None, seed=None, seed_required=False, scale=None):
  """Raise a ValueError of one line per problem of `frame` (read from `path`) in the metric column
  `metric` (on the declared `scale` when given), the other numbers read (CHECKED), the platforms,
  the test sets, the run ids and identities and the seed column `seed` (each None: not checked;
  `seed_required`: an empty seed of a completed run is a problem)."""
  lines = metric_problems(frame, metric, scale) if metric else []
  lines += [
    line for c in CHECKED if c in frame and c != metric for line in metric_problems(frame, c)
  ]
  lines += columns.platform_problems(frame) + columns.test_set_problems(frame)
  lines += run_id_problems(frame) + identity_problems(frame)
  lines += seed_problems(frame, seed, seed_required) if seed else []
  if not lines:
    return
  more = len(lines) - MAX_LINES
  shown = lines[:MAX_LINES] + (
    [f'... and {more} more problems of the same kinds'] if more > 0 else []
  )
  raise ValueError(
    '\n'.join(f'--csv {path}: {line}' for line in shown)
    + f'\n--csv {path}: {len(lines)} problem(s) above; nothing was analysed'
  )


def duplicate_columns(path, header):
  """The refusal of a `header` that names a column twice ('' when none): pandas would rename the
  second 'x' to 'x.1' and read the first."""
  repeated = [name for name, count in collections.Counter(header).items() if count > 1]
  if not repeated:
    return ''

  def at(name):
    return ', '.join(str(i + 1) for i, h in enumerate(header) if h == name)

  return (
    f'--csv: {path} has duplicate column names: '
    + '; '.join(f'{name} (columns {at(name)})' for name in repeated)
    + '; rename them so each column has its own name'
  )


def read_csv(
  path: Union[str, os.PathLike[str]],
  metric: Optional[str] = None,
  seed_col: Optional[str] = None,
  names: Sequence[str] = (),
  seed_required: bool = False,
  scale: Optional[float] = None,
) -> pd.DataFrame:
  """A CSV of published results as a runs table (`run` = 'FILE:ROW' when it has no run column),
  its used columns only (read_columns: `metric` and `names` are the metric and the columns the
  command names), checked before anything is computed (check: the metric's scale (or `scale`,
  --scale, when given) and range, unique run ids, whole-number seeds in `seed_col`, default
  'seed', and with `seed_required` one for every completed run).
  Refused, naming --csv: an unreadable or empty file, a header without rows, repeated column
  names (pandas would rename the second 'x' to 'x.1' and read the first), the checks' problems."""
  try:
    header = list(pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0])
    repeated = duplicate_columns(path, header)
    if repeated:  # a ValueError of its own: not one of those below
      raise ValueError(repeated)
    if metric:
      metric = resolve_column(pd.DataFrame(columns=header), metric, '--metric')
    frame = read_columns(path, header, metric, names, seed_col or 'seed')
  except pd.errors.EmptyDataError:
    raise ValueError(
      f'--csv: {path} is empty: no runs to analyse; give a CSV with a header row '
      'and one row per run'
    ) from None
  except (OSError, UnicodeDecodeError, pd.errors.ParserError) as e:
    raise ValueError(
      f'--csv: cannot read {path} ({e}); give a CSV file with a header row'
    ) from None
  if frame.empty:
    raise ValueError(
      f'--csv: {path} has a header but no rows: no runs to analyse; add one row per run'
    )
  seed = resolve_column(frame, seed_col, '--seed-col') if seed_col not in (None, 'seed') else 'seed'
  check(frame, path, metric, seed if seed in frame else None, seed_required, scale)
  if 'run' not in frame:
    frame.insert(0, 'run', [f'{path}:{i + 2}' for i in range(len(frame))])
  return frame
