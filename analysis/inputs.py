"""What the analysis reads: run folders (local or gs://), a CSV of runs, the columns and labels of
a runs table and each run's saved predictions; bad input: one line per problem (docs/statistics.md).
"""

import collections
import dataclasses
import json
import logging
import math
import os
import posixpath
import re
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import pandas as pd
from etils import epath

from analysis import declaration
from runrecord import record, rules

PLATFORM = 'platform'
MAX_SHOWN = 3  # values named per test-set problem
MAX_LINES = 10  # problems listed per CSV, then a count
CHUNK_ROWS = 20_000  # a CSV is read this many rows at a time (bounded parser buffers)
ALWAYS_READ = ('final.train_loss',)  # the loss table beside any metric
CHECKED = ('final.train_loss', 'final.test_loss', record.DEFAULT_METRIC)  # checked as a metric is
ID = 'run_id'  # runrecord/record.py's run identity, as analysis.export writes it
METRICS_FILE = record.METRICS
STEP_COLUMNS = ('run', 'step', 'epoch', 'train_loss', 'train_accuracy')
Roots = Union[str, epath.Path, Sequence[Union[str, epath.Path]]]  # what --runs gives
# Why a run has no predictions to compare (only the agreement sections leave it out).
NONE_SAVED = 'no predictions saved'
NOT_AT_STEP = "no predictions at its results' step"
NO_STEP = 'its results name no step'
DAMAGED = 'predictions item damaged'
Read = tuple[Optional[dict[str, Any]], Optional[str]]  # (predictions, None) or (None, why not)


def completed_rows(frame):
  """The rows that are analysed: status 'completed' (every row without a status column)."""
  if 'status' not in frame:
    return pd.Series(True, index=frame.index)
  return frame['status'].astype(str).eq('completed')


def line_numbers(index):
  """The file's line numbers of rows `index` (the header is line 1)."""
  return [int(i) + 2 for i in index]


def platform_name(value):
  """`value` as JAX spells a platform: the part before the first '-' lower case, no outer spaces."""
  if value is None or (isinstance(value, float) and value != value):
    return ''
  head, sep, tail = str(value).strip().partition('-')
  return head.lower() + sep + tail


def normalise_platforms(frame):
  """(frame, notes): each platform name as platform_name spells it, a note per name changed."""
  if PLATFORM not in frame:
    return frame, []
  values = frame[PLATFORM]
  renamed = {v: platform_name(v) for v in pd.unique(values.dropna()) if platform_name(v) != v}
  if not renamed:
    return frame, []
  mapped = values.astype(object).map(lambda v: renamed.get(v, v) if isinstance(v, str) else v)
  if isinstance(values.dtype, pd.CategoricalDtype):
    mapped = mapped.astype('category')
  frame = frame.assign(**{PLATFORM: mapped})
  notes = [
    f'platform {old!r} read as {new!r} (JAX spells the platform in lower case)'
    for old, new in renamed.items()
    if new
  ]
  return frame, notes


def is_accuracy(metric):
  """Is `metric` an accuracy by its name (one in [0, 1] or in %, judged in pp)?"""
  return 'acc' in str(metric).lower()


RECORDED_PLATFORM = 'platform_recorded'  # a split platform's name as its runs recorded it


def split_device_kinds(frame):
  """Runs of one platform on several device kinds (an H100 and an A100) as a platform each,
  'gpu-NVIDIA A100' and 'gpu-NVIDIA H100' (the JAX platform first, as a CPU's instruction set
  is): never pooled into one. RECORDED_PLATFORM keeps the recorded name."""
  if PLATFORM not in frame or 'device_kind' not in frame or RECORDED_PLATFORM in frame:
    return frame
  platform, kind = frame[PLATFORM].astype(object), frame['device_kind'].astype(object)
  known = kind.notna() & kind.astype(str).str.strip().ne('') & platform.notna()
  several = kind[known].groupby(platform[known]).nunique()
  split = known & platform.isin(several[several > 1].index)
  if not split.any():
    return frame
  named = platform.astype(str) + '-' + kind.astype(str).str.strip()
  return frame.assign(**{PLATFORM: platform.where(~split, named), RECORDED_PLATFORM: platform})


def row_name(frame, index):
  """How a message names row `index`: its run, else its line of the file."""
  return frame.at[index, 'run'] if 'run' in frame else f'line {line_numbers([index])[0]}'


def ignored(column):
  """Is `column` a config field that cannot change a run's numbers (record.IGNORED_FIELDS)?"""
  field = column[len(record.CONFIG_PREFIX) :]
  return column.startswith(record.CONFIG_PREFIX) and any(
    field == f or field.startswith(f + '.') for f in record.IGNORED_FIELDS
  )


def test_set_problems(frame):
  """One line per record.TEST_SET field with several values among the completed runs of one data
  config, or one for runs of several datasets: their accuracies do not compare."""
  done = frame[completed_rows(frame)]
  name = f'{record.CONFIG_PREFIX}data.name'
  if name in done and done[name].nunique() > 1:
    said = ', '.join(f'{k} ({n} runs)' for k, n in sorted(done[name].value_counts().items()))
    return [f'{name}: runs of several datasets ({said}); analyse each dataset apart']
  fields = [c for c in record.TEST_SET if c in done]
  if not fields or done.empty:
    return []
  config = [c for c in done if c.startswith(f'{record.CONFIG_PREFIX}data.') and not ignored(c)]
  groups = (
    done.groupby(config, dropna=False, observed=True, sort=False)[fields]
    if config
    else done[fields].groupby(pd.Series(0, index=done.index))
  )
  counts = groups.nunique()
  lines = []
  for key in counts.index[(counts > 1).any(axis=1)]:
    rows = done.loc[groups.groups[key], fields]
    rows = rows.astype(str).where(rows.notna())
    for field in [f for f in fields if counts.loc[key, f] > 1]:
      values = rows[field].dropna()
      shown = ', '.join(
        f'{v!r} ({(values == v).sum()} runs, e.g. {row_name(done, values.index[values == v][0])})'
        for v in pd.unique(values)[:MAX_SHOWN]
      )
      lines.append(
        f'{field}: runs of one data config were tested on different test sets '
        f'({shown}); their accuracies do not compare: analyse them apart, or rerun '
        'the odd ones on the same data'
      )
  return lines


def seed_key(seed):
  """Sort seeds numerically, text seeds by their numbers ('2 (init 2, data 1)' before '10 (...')."""
  try:
    return (0, float(seed), ())
  except (TypeError, ValueError):
    return (1, 0.0, tuple(int(p) if p.isdigit() else p for p in re.split(r'(\d+)', str(seed))))


def seed_text(seeds):
  """'0–4 7 9': the distinct seeds in order, 3 or more consecutive integers as one range."""

  def whole(s):
    return isinstance(s, (int, np.integer))

  parts = []  # [first, last] of each run of consecutive integers (or a lone seed)
  for seed in sorted(set(seeds.dropna()), key=seed_key):
    if parts and whole(seed) and whole(parts[-1][1]) and seed == parts[-1][1] + 1:
      parts[-1][1] = seed
    else:
      parts.append([seed, seed])
  return ' '.join(str(a) if a == b else f'{a} {b}' if b == a + 1 else f'{a}–{b}' for a, b in parts)


def whole_numbers(values):
  """A float column of whole numbers as Python ints (None where missing), so seeds print as 0 1."""
  v = values.to_numpy()
  if values.dtype.kind != 'f' or not np.all(np.isnan(v) | (np.isfinite(v) & (v == np.floor(v)))):
    return values
  return pd.Series([None if np.isnan(x) else int(x) for x in v], index=values.index, dtype=object)


def label_columns(keys, names):
  """The group columns an arm label needs: in order, each one that splits the arms further."""
  chosen, distinct = [], 1
  for i, _ in enumerate(names):
    count = len({tuple(k[j] for j in chosen + [i]) for k in keys})
    if count > distinct:
      chosen, distinct = chosen + [i], count
  return chosen or list(range(len(names)))


def arm_labels(runs, group_by):
  """Each run's arm label: the values of `group_by` (as text), each distinct key labelled once."""
  texts = [whole_numbers(runs[g]).astype(str) for g in group_by]
  keys = list(zip(*texts, strict=True)) if texts else [()] * len(runs)
  distinct = list(dict.fromkeys(keys))
  chosen = label_columns(distinct, group_by)
  named = [g not in record.ARM_CONTEXT for g in group_by]  # 'tpu, compute_dtype=bfloat16'
  label = {
    k: ', '.join(f'{rules.field_name(group_by[i])}={k[i]}' if named[i] else k[i] for i in chosen)
    for k in distinct
  }
  return [label[k] for k in keys]


def distinct(values):
  """The distinct values of a column as text: one value, or 'a, b (differ between runs)'."""
  seen = sorted({str(v) for v in values.dropna()})
  if not seen:
    return None
  return seen[0] if len(seen) == 1 else ', '.join(seen) + ' (differ between runs)'


def recorded(runs, *columns):
  """The distinct values (distinct) of the first of `columns` the runs record, else None."""
  texts = (distinct(runs[column]) for column in columns if column in runs)
  return next((text for text in texts if text is not None), None)


def unused(column, metric, names):
  """Whether no analysis of `metric` (None: every metric) and of the columns `names` reads it."""
  if column in names or column == metric or column in ALWAYS_READ:
    return False
  if column.startswith('final.'):
    return metric is not None
  return ignored(column)


def compact(chunk, plain):
  """The chunk with its text columns but `plain` as categoricals (a few values over every run)."""
  for column in chunk.columns:
    if column not in plain and not pd.api.types.is_numeric_dtype(chunk[column]):
      chunk[column] = chunk[column].astype('category')
  return chunk


def join_chunks(chunks):
  """The chunks as one table, a column categorical in every chunk staying categorical."""
  columns = {}
  for name in chunks[0].columns:
    parts = [chunk[name] for chunk in chunks]
    cats = [isinstance(part.dtype, pd.CategoricalDtype) for part in parts]
    if all(cats):
      joined = pd.api.types.union_categoricals(parts, ignore_order=True)
      columns[name] = pd.Series(joined, name=name)
    else:
      plain = [part.astype(object) if cat else part for part, cat in zip(parts, cats, strict=True)]
      columns[name] = pd.concat(plain, ignore_index=True)
  return pd.DataFrame(columns)


def one_row_per_run(frame):
  """(frame, notes): rows equal in every value but `run` (its `run_id` included where the CSV has
  one) are one run met twice, kept once; an id with two contents is check_csv's to refuse."""
  others = [c for c in frame.columns if c != 'run']
  if ID not in frame and 'wall_time_s' not in frame:  # no run's own facts (a published table):
    return frame, []  # equal rows are different runs
  repeated = frame.duplicated(others, keep=False)
  if not repeated.any():
    return frame, []
  notes = []
  for _, rows in frame[repeated].groupby(others, dropna=False, sort=False, observed=True):
    which = (
      f'run id {rows[ID].iloc[0]} on lines' if ID in rows and rows[ID].notna().all() else 'lines'
    )
    lines = ', '.join(map(str, line_numbers(rows.index)))
    notes.append(f'{which} {lines}: one run met twice (the same values): counted once')
  return frame[~frame.duplicated(others)], notes


def each(values):
  """(line number, value) of each cell of `values`."""
  return zip(line_numbers(values.index), values, strict=True)


def metric_problems(frame, column, scale=None):
  """The metric column's problems, one line each: text, infinite, negative."""
  values = frame.loc[completed_rows(frame), column]
  numbers = pd.to_numeric(values, errors='coerce')
  text = values[values.notna() & numbers.isna()]
  lines = [
    f'{column}, line {n}: {v!r} is not a number; write the number, or leave the cell empty '
    'to exclude the run'
    for n, v in each(text)
  ]
  numbers = numbers.dropna().astype(float)
  infinite = numbers[~np.isfinite(numbers)]
  lines += [
    f"{column}, line {n}: {v} is not finite; write the run's value, or leave the cell "
    'empty to exclude the run'
    for n, v in each(infinite)
  ]
  numbers = numbers[np.isfinite(numbers)]
  kind = 'an accuracy' if is_accuracy(column) else 'a loss' if 'loss' in column.lower() else None
  if kind:
    low = numbers[numbers < 0]
    lines += [
      f'{column}, line {n}: {v:g} is negative, and {kind} is >= 0; correct the value'
      for n, v in each(low)
    ]
  if kind == 'an accuracy' and scale is not None:
    high = numbers[numbers * scale > 100]
    return lines + [
      f'{column}, line {n}: {v:g} x --scale {scale:g} is above 100 %; correct the value or --scale'
      for n, v in each(high)
    ]
  if kind == 'an accuracy':
    high = numbers[numbers > 100]
    lines += [
      f'{column}, line {n}: {v:g} is above 100; an accuracy is a fraction in [0, 1] or a '
      'percent in [0, 100]: correct the value'
      for n, v in each(high)
    ]
    fractions = numbers[(numbers > 0) & (numbers <= 1)]  # mixed with percents: the fewer named
    percents = numbers[(numbers > 1) & (numbers <= 100)]
    if fractions.empty or percents.empty:
      return lines
    if len(percents) <= len(fractions):
      odd, fix = percents, f'in percent while {len(fractions)} rows are fractions: divide it by 100'
    else:  # a percent at most 1 is possible (a run at 0.8 %): say how to keep it
      odd = fractions
      fix = (
        f'at most 1 while {len(percents)} rows are in percent: a fraction? multiply it by 100; '
        'a real percent below 1? give --scale 1 (the column is in percent)'
      )
    lines += [
      f'{column}, line {n}: {v:g} is {fix} (one scale for the whole column)' for n, v in each(odd)
    ]
  return lines


def check_csv(frame, path, metric=None, seed=None, seed_required=False, scale=None):
  """A ValueError of one line per problem of the CSV's metric, other numbers (CHECKED)."""
  lines = metric_problems(frame, metric, scale) if metric else []
  lines += [
    line for c in CHECKED if c in frame and c != metric for line in metric_problems(frame, c)
  ]
  if PLATFORM in frame:  # a completed run without a platform, names that differ only in case
    names = frame.loc[completed_rows(frame), PLATFORM].astype(object).map(platform_name)
    lines += [
      f'{PLATFORM}, line {n}: the platform is empty; write the platform the run ran on '
      '(e.g. gpu), or leave the run out'
      for n in line_numbers(names[names == ''].index)
    ]
    spelled: dict[str, list[str]] = {}
    for name in pd.unique(names[names != '']):
      spelled.setdefault(name.lower(), []).append(name)
    for spellings in (s for s in spelled.values() if len(s) > 1):
      where = '; '.join(
        f'{s!r} on line {line_numbers(names.index[names == s])[0]}' for s in spellings
      )
      lines.append(
        f'{PLATFORM}: {where} differ only in case: one platform or two? write one '
        'spelling per platform'
      )
  lines += test_set_problems(frame)
  if 'run' in frame:  # a run id on more than one line, or empty
    empty = frame['run'].isna()
    lines += [
      f'run, line {n}: the run id is empty; give each run its own id'
      for n in line_numbers(frame.index[empty])
    ]
    runs = frame.loc[~empty, 'run'].astype(str)
    repeated = runs[runs.duplicated(keep=False)]
    lines += [
      f'run, lines {", ".join(map(str, line_numbers(rows.index)))}: run id {run!r} appears '
      f'{len(rows)} times; give each run its own id (runs of one seed are replicates only '
      'under different ids)'
      for run, rows in repeated.groupby(repeated, sort=False)
    ]
  ids = frame[ID].astype(object) if ID in frame else pd.Series([], dtype=object)
  repeated = ids[ids.notna() & ids.duplicated(keep=False)]  # kept apart by one_row_per_run
  for run_id, rows in repeated.groupby(repeated, sort=False):
    places = ', '.join(
      f'line {n}' + (f' ({frame.at[i, "run"]})' if 'run' in frame else '')
      for n, i in zip(line_numbers(rows.index), rows.index, strict=True)
    )
    lines.append(
      f'{ID}: run id {run_id!r} holds different values on {places}: one run with two '
      'records (a copy taken at another step?); keep the one you mean'
    )
  if seed:  # a seed that is not a whole number, or (seed_required) missing on a completed run
    values = frame[seed]
    numbers = pd.to_numeric(values, errors='coerce')
    whole = numbers.notna() & np.isfinite(numbers) & (numbers == np.floor(numbers))
    lines += [
      f"{seed}, line {n}: {v!r} is not a whole-number seed; write the run's integer seed"
      for n, v in each(values[values.notna() & ~whole])
    ]
    lines += [
      f"{seed}, line {n}: the seed is empty; write the run's integer seed (the "
      'attribution groups runs by seed)'
      for n in line_numbers(values[values.isna() & completed_rows(frame) & seed_required].index)
    ]
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


def read_csv(
  path: Union[str, os.PathLike[str]],
  metric: Optional[str] = None,
  seed_col: Optional[str] = None,
  names: Sequence[str] = (),
  seed_required: bool = False,
  scale: Optional[float] = None,
) -> pd.DataFrame:
  """A CSV of runs as a runs table (`run` = 'FILE:ROW' without a run column)."""
  try:
    header = list(pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0])
    if len(header) == 1 and ';' in str(header[0]):
      raise ValueError(f'--csv: {path} is separated by ";"; save it with commas (a CSV)')
    repeated = [name for name, count in collections.Counter(header).items() if count > 1]
    if repeated:  # a ValueError of its own, not one of those below: pandas would read x as x.1
      where = [', '.join(str(i + 1) for i, h in enumerate(header) if h == n) for n in repeated]
      raise ValueError(
        f'--csv: {path} has duplicate column names: '
        + '; '.join(f'{n} (columns {at})' for n, at in zip(repeated, where, strict=True))
        + '; rename them so each column has its own name'
      )
    if metric:
      metric = declaration.resolve_column(pd.DataFrame(columns=header), metric, '--metric')
    keep = [c for c in header if not unused(c, metric, set(names))]
    plain = {'run', ID, 'status', 'reason', metric, seed_col or 'seed'}
    frame = join_chunks(
      [compact(chunk, plain) for chunk in pd.read_csv(path, usecols=keep, chunksize=CHUNK_ROWS)]
    )
    frame, notes = normalise_platforms(frame)  # first: its notes name the cells as written
    for name in frame.columns:  # surrounding spaces dropped from text cells: 'f32 ' is no arm
      values = frame[name]
      if isinstance(values.dtype, pd.CategoricalDtype):
        cats = list(values.cat.categories)
        if [c.strip() if isinstance(c, str) else c for c in cats] != cats:
          frame[name] = (
            values.astype(object)
            .map(lambda v: v.strip() if isinstance(v, str) else v)
            .astype('category')
          )
    if 'status' in frame:  # 'completed ' is completed
      frame['status'] = frame['status'].map(lambda v: v.strip() if isinstance(v, str) else v)
    if seed_col in (None, 'seed') and 'seed' not in frame and 'config.seed' in frame:
      frame['seed'] = frame['config.seed']  # one seed for the contrasts, the gap and the scope
      notes.append('no seed column: config.seed read as the seed')
    frame, once = one_row_per_run(frame)
    for note in notes + once:
      print(f'note: --csv {path}: {note}', file=sys.stderr)
  except pd.errors.EmptyDataError:
    raise ValueError(
      f'--csv: {path} is empty: no runs to analyse; give a CSV with a header row '
      'and one row per run'
    ) from None
  except (OSError, UnicodeDecodeError, pd.errors.ParserError) as e:
    raise ValueError(f'--csv: cannot read {path} ({e}); give a CSV file with a header row') from e
  if frame.empty:
    raise ValueError(
      f'--csv: {path} has a header but no rows: no runs to analyse; add one row per run'
    )
  seed = (
    declaration.resolve_column(frame, seed_col, '--seed-col')
    if seed_col not in (None, 'seed')
    else 'seed'
  )
  check_csv(frame, path, metric, seed if seed in frame else None, seed_required, scale)
  if 'run' not in frame:
    frame.insert(0, 'run', [f'{path}:{i + 2}' for i in range(len(frame))])
  return frame


def identity(path):
  """What tells two folders apart: a local folder's device and inode (shared by its symlinks)."""
  text = str(path)
  scheme, sep, rest = text.partition('://')
  if sep:
    return f'{scheme}://{posixpath.normpath(rest)}'
  try:
    stat = os.stat(text)
  except OSError:
    return os.path.realpath(text)
  return f'inode {stat.st_dev}:{stat.st_ino}'


def walk(root):
  """(run folders, [(unreadable folder, its OSError)]) under `root`, sorted."""
  found, unreadable, seen = [], [], set()
  path = epath.Path(root)
  try:
    exists, is_dir = path.exists(), path.is_dir()
  except ImportError as e:
    raise ValueError(
      f'--runs: {root}: reading a bucket needs a filesystem package ({e}); '
      'pip install gcsfs, or copy the runs to a local folder'
    ) from e
  except Exception as e:  # a bucket backend's own error types (no access, ...): the chain kept
    first = (str(e).strip().splitlines() or [''])[0][:200]
    raise ValueError(
      f'--runs: cannot read {root} ({type(e).__name__}: {first}); check the path '
      'and your access to it'
    ) from e
  if not exists:
    raise ValueError(
      f'--runs: {root} does not exist; give the folder (or gs:// path) holding the runs'
    )
  if not is_dir:
    raise ValueError(f'--runs: {root} is not a folder; give the folder holding the runs')
  todo, linked = [path], []
  while todo or linked:
    folder = todo.pop() if todo else linked.pop()
    key = identity(folder)
    if key in seen:
      continue
    seen.add(key)
    try:
      children = [c for c in folder.iterdir() if c.is_dir()]
    except OSError as e:
      unreadable.append((str(folder), e))
      continue
    if any(c.name == record.CHECKPOINTS for c in children):
      found.append(str(folder))
    for child in sorted(children, reverse=True):
      if child.name != record.CHECKPOINTS:
        (linked if os.path.islink(str(child)) else todo).append(child)
  return sorted(found), sorted(unreadable, key=lambda item: item[0])


def as_roots(roots):
  """A list of roots from one root (str or path) or several."""
  return [str(roots)] if isinstance(roots, (str, epath.Path)) else [str(r) for r in roots]


def find_all(roots, unreadable=None):
  """Every run folder under every root, each once; a run under two roots is refused."""
  found, first, roots_seen = [], {}, set()
  for root in as_roots(roots):
    if identity(root) in roots_seen:
      continue
    roots_seen.add(identity(root))
    runs, locked = walk(root)
    if not runs and not locked:
      raise ValueError(
        f'--runs: no run (a folder holding {record.CHECKPOINTS}/) under {root}; '
        'point it at the sweep root or a run workdir'
      )
    for run in runs:
      key = identity(run)
      if key in first:
        raise ValueError(
          f'--runs: one run is under both {first[key][1]} (as {first[key][0]}) and '
          f'{root} (as {run}); give each root once, no root inside another and no '
          'symlink from one root into another'
        )
      first[key] = (run, root)
    found += runs
    if unreadable is not None:
      unreadable += locked
  return found


def read_all(roots):
  """[(run, its record, None, or the Exception reading it raised)] of every run under the roots,
  each run once (one_record_per_run); an unlistable folder with its error."""
  locked = []
  runs = find_all(roots, locked)
  out = []
  with record.orbax_warnings_off():
    for run in runs:
      try:
        out.append((run, record.read_results(run)))
      except Exception as e:  # a corrupt run must not hide the others; it is listed as excluded
        out.append((run, e))
  return one_record_per_run(out) + locked


def one_record_per_run(records):
  """`records` with each run once by its identity (record.run_identity; a record without its
  run_id, e.g. a copy where it was removed, is the run whose other content it has)."""

  bare = [  # each record's identity without its run_id (records without one: run_identity)
    record.run_identity({k: v for k, v in r.items() if k != 'run_id'})
    if isinstance(r, dict)
    else None
    for _, r in records
  ]
  ids = {
    b: str(r['run_id']) for b, (_, r) in zip(bare, records, strict=True) if b and r.get('run_id')
  }
  first, kept, notes = {}, [], []
  for (run, results), b in zip(records, bare, strict=True):
    key = ids.get(b, b)
    if key is None or key not in first:
      first.setdefault(key, (run, results))
      kept.append((run, results))
      continue
    other, saved = first[key]
    differ = sorted(
      k
      for k in (saved.keys() | results.keys()) - {'run_id'}
      if json.dumps(saved.get(k), sort_keys=True, default=str)
      != json.dumps(results.get(k), sort_keys=True, default=str)
    )
    if differ:
      (a, s), (b, t) = ((r.get('step'), r.get('status')) for r in (saved, results))
      what = f'step {a}, {s} vs step {b}, {t}'
      why = 'one is a copy of the other taken at another point'
      if (a, s) == (b, t):
        what = f'both at step {a}, {s}, differing in {", ".join(differ[:4])}'
        why = 'copies that went on separately'
      raise ValueError(
        f'--runs: run {key} is at {other} and at {run} with different records ({what}): {why}; '
        'keep the one you mean'
      )
    notes.append(f'note: {run} is the run at {other} (run id {key}, the same record): counted once')
  for note in notes:
    print(note, file=sys.stderr)
  return kept


def runs_frame(records):
  """One row per (run, record): record.BASE_COLUMNS, then the flattened parts."""
  rows = []
  for run, results in records:
    if isinstance(results, Exception):
      rows.append(
        {'run': run, 'status': 'unreadable', 'reason': f'{type(results).__name__}: {results}'}
      )
    else:
      rows.append(rules.row(run, results))
  frame = pd.DataFrame(rows)
  for name in record.BASE_COLUMNS:
    if name not in frame:
      frame[name] = None
  rest = sorted(c for c in frame.columns if c not in record.BASE_COLUMNS)
  return frame[list(record.BASE_COLUMNS) + rest].reset_index(drop=True)


def histories_frame(records):
  """One row per run and evaluated epoch: `run` and each history field."""
  rows = []
  for run, results in records:
    if isinstance(results, dict):
      rows.extend({'run': run, **entry} for entry in results.get('history') or [])
  return pd.DataFrame(rows) if rows else pd.DataFrame(columns=['run', 'epoch'])


def check_runs(frame):
  """The runs table, refused in one line per test_set_problems line."""
  lines = test_set_problems(frame)
  if lines:
    raise ValueError('\n'.join(f'--runs: {line}' for line in lines))
  return frame


def load(roots: Roots) -> tuple[pd.DataFrame, pd.DataFrame]:
  """(runs_frame, histories_frame) of every run under the roots, the runs checked (check_runs)."""
  records = read_all(roots)
  return check_runs(runs_frame(records)), histories_frame(records)


def load_study(roots: Roots, study: Optional[str] = None):
  """(runs, histories, declaration) of a study's run folders: the declaration from `study`."""
  frame, hist = load(roots)
  if study:
    declared, where = declaration.load(study), str(study)
  else:
    declared, where = declaration.from_roots(roots)
  declaration.check_levels(declared, frame, where)
  return frame, hist, declared or {}


def load_runs(roots, checked=True):
  """One row per run under the roots (runs_frame), checked unless not `checked` (export)."""
  frame = runs_frame(read_all(roots))
  return check_runs(frame) if checked else frame


def train_records(run):
  """The training records ('kind': 'train') of a run folder's metrics.jsonl, torn lines skipped."""
  path = epath.Path(run) / METRICS_FILE
  if not path.exists():
    return
  for line in path.read_bytes().decode('utf-8', 'replace').splitlines():
    try:
      entry = json.loads(line)
    except json.JSONDecodeError:
      continue
    if entry.get('kind') == 'train':
      yield entry


def steps_frame(runs):
  """One row per logged training record of each run folder (STEP_COLUMNS)."""
  rows = [
    {'run': str(run), **{k: entry.get(k) for k in STEP_COLUMNS[1:]}}
    for run in runs
    for entry in train_records(run)
  ]
  return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def known(value):
  """`value` as an int, or None when missing (None, NaN)."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return None
  return int(value)


def item_problem(pred, test_size=None, fingerprint=None):
  """Why a predictions item cannot be compared image by image (None: it can)."""
  task = pred.get('task')
  if task not in record.PREDICTION_KEYS:
    return f'task {task!r} is neither of {", ".join(record.PREDICTION_KEYS)}'
  absent = [k for k in record.PREDICTION_KEYS[task] if k not in pred]
  if absent:
    return f'no {", ".join(absent)} array'
  lengths = {k: len(np.asarray(pred[k])) for k in record.PREDICTION_KEYS[task]}
  if len(set(lengths.values())) > 1:
    return 'arrays of different lengths (' + ', '.join(f'{k} {n}' for k, n in lengths.items()) + ')'
  n = next(iter(lengths.values()))
  if test_size is not None and n != test_size:
    return f'{n} examples, the test split has {test_size}'
  saved = str(pred.get('fingerprint') or '')
  if fingerprint and saved and saved != str(fingerprint):
    return f'the predictions of test split {saved}, the results of {fingerprint}'
  return None


DAMAGED_FOLDERS: set[str] = set()  # run folders whose item failed to read (quiet_failed_reads)


class _FailedReads(logging.Filter):
  """Drops asyncio's 'Task exception was never retrieved' records about a damaged folder."""

  def filter(self, rec):
    text = str(rec.exc_info[1]) if rec.exc_info else rec.getMessage()
    return not any(folder in text for folder in DAMAGED_FOLDERS)


def quiet_failed_reads(run):
  """After a failed read, Orbax's other restore tasks fail later with tracebacks."""
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


def predictions_at(run: str, step: Any, test_size: Any = None, fingerprint: Any = None) -> Read:
  """(predictions, None) of run folder `run` at its results' checkpoint `step`."""
  step, test_size = known(step), known(test_size)
  fingerprint = None if fingerprint is None or fingerprint != fingerprint else fingerprint
  if step is None:
    return None, NO_STEP
  try:
    steps = record.saved_steps(run)
  except OSError as e:
    return None, f'{DAMAGED} ({type(e).__name__}: {e})'
  if not steps:
    return None, NONE_SAVED
  if step not in steps:
    return None, f'{NOT_AT_STEP} ({step}; the newest at step {steps[-1]}: an older evaluation)'
  try:
    pred = record.read_predictions(run, step)
  except Exception as e:  # Orbax/TensorStore's own error types: the run's reason
    quiet_failed_reads(run)
    first = (str(e).strip().splitlines() or [''])[0][:200]
    return None, f'{DAMAGED} (step {step}: {type(e).__name__}: {first})'
  problem = item_problem(pred, test_size, fingerprint)
  return (None, f'{DAMAGED} (step {step}: {problem})') if problem else (pred, None)


def read_predictions(runs: pd.DataFrame) -> list[Read]:
  """predictions_at of each row of the runs table `runs` (its run, step, test size, fingerprint)."""
  none = [None] * len(runs)
  columns = [runs.get(c, none) for c in ('step', 'data.test_size', 'data.split_fingerprint')]
  return [predictions_at(*row) for row in zip(runs['run'], *columns, strict=True)]


class Platform(NamedTuple):
  """A platform's recorded device kind, device count, package versions and CPU facts (distinct)."""

  device_kind: Optional[str]
  devices: Optional[str]
  versions: dict[str, Optional[str]]
  cpu: dict[str, Optional[str]]


@dataclasses.dataclass(frozen=True)
class Software:
  """Each platform's `platforms` facts, and the packages whose versions differ between them."""

  platforms: dict[str, Platform] = dataclasses.field(default_factory=dict)
  confounds: list[str] = dataclasses.field(default_factory=list)


def software(runs):
  """The Software of the analysed runs."""
  if 'platform' not in runs:
    return Software()
  prefix = 'versions.'
  packages = sorted(c[len(prefix) :] for c in runs if c.startswith(prefix))
  out = {}
  for platform, group in runs.groupby(runs['platform'].astype(str), sort=True):
    out[platform] = Platform(
      device_kind=distinct(group.get('device_kind', pd.Series(dtype=str))),
      devices=distinct(group.get('num_devices', pd.Series(dtype=str))),
      versions={p: distinct(group[prefix + p]) for p in packages},
      cpu={f: distinct(group[f]) if f in group else None for f in record.CPU_FACTS},
    )
  confounds = [
    p for p in packages if len({v.versions[p] for v in out.values() if v.versions[p]}) > 1
  ]
  return Software(platforms=out, confounds=confounds)
