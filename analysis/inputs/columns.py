"""Which column of a runs table a name means, and what the columns the analysis reads beside the
metric must hold (analysis/inputs/csv_input.py checks the metric itself): one owner for each rule,
used by the CSV reader and by the run folders' reader alike.

  resolve_column(frame, 'profile', '--group-by')  # 'numerics.requested.profile'
  frame, notes = normalise_platforms(frame)       # ' GPU' -> 'gpu' (a CSV's cells)
  lines = platform_problems(frame)                # empty cells; 'cpu-avx2' beside 'cpu-AVX2'
  lines = test_set_problems(frame)                # one test set per data config

Platform names (the `platform` column every analysis groups, pools and pairs by): surrounding
spaces are dropped and the JAX platform part is lower case, as JAX spells it ('GPU ' is 'gpu',
'CPU-AVX2' is 'cpu-AVX2'); an empty cell of a completed run is refused, and so are two spellings
that still differ only in case ('cpu-avx2' and 'cpu-AVX2': one platform or two?).

The test set (runrecord/record.py TEST_SET: the source files' and the test split's fingerprints,
the test split's size) must be one among the completed runs of one data config (equal
`config.data.*` fields, where the files live aside): runs tested on other images are neither
replicates nor pairs, and a study whose platforms saw different test splits would compare them as
if they had not. Other data configs (another split seed, declared as a factor) may hold other
test sets: their runs never pair (record.PAIRING_FIELDS holds the same fields).
Reference: docs/statistics.md "Input the analysis refuses".
"""

import pandas as pd

from runrecord import record

PLATFORM = 'platform'
MAX_SHOWN = 3


def resolve_column(frame, name, arg):
  """The column of `frame` that `name` means: exact, or with a `numerics.`, `config.` or
  `final.` prefix."""
  for candidate in (
    name,
    f'{record.ARM_PREFIX}{name}',
    f'numerics.effective.{name}',
    f'{record.CONFIG_PREFIX}{name}',
    f'final.{name}',
  ):
    if candidate in frame.columns:
      return candidate
  shown = ', '.join(c for c in frame.columns if not c.startswith(('config.', 'versions.', 'data.')))
  raise ValueError(f'{arg}: no column {name!r}; choose from {shown} (or any config.* field)')


def completed_rows(frame):
  """The rows that are analysed: status 'completed' (every row without a status column)."""
  if 'status' not in frame:
    return pd.Series(True, index=frame.index)
  return frame['status'].astype(str).eq('completed')


def line_numbers(index):
  """The file's line numbers of rows `index` (the header is line 1)."""
  return [int(i) + 2 for i in index]


def platform_name(value):
  """`value` as a platform name: surrounding spaces dropped, the JAX platform (before the first
  '-') in lower case; '' for an empty cell."""
  if value is None or (isinstance(value, float) and value != value):
    return ''
  head, sep, tail = str(value).strip().partition('-')
  return head.lower() + sep + tail


def normalise_platforms(frame):
  """(frame, notes): the `platform` column with each name as platform_name spells it (a new
  column; categorical stays categorical), and one note per name that changed."""
  if PLATFORM not in frame:
    return frame, []
  values = frame[PLATFORM]
  distinct = [v for v in pd.unique(values.dropna())]
  renamed = {v: platform_name(v) for v in distinct if platform_name(v) != v}
  if not renamed:
    return frame, []
  mapped = values.astype(object).map(lambda v: renamed.get(v, v) if isinstance(v, str) else v)
  frame = frame.assign(
    **{
      PLATFORM: mapped.astype('category')
      if isinstance(values.dtype, pd.CategoricalDtype)
      else mapped
    }
  )
  notes = [
    f'platform {old!r} read as {new!r} (JAX spells the platform in lower case, without spaces)'
    for old, new in renamed.items()
    if new
  ]
  return frame, notes


def platform_problems(frame):
  """One line per completed run whose platform cell is empty, and per set of platform names that
  differ only in case (after normalise_platforms)."""
  if PLATFORM not in frame:
    return []
  done = frame.loc[completed_rows(frame), PLATFORM]
  names = done.astype(object).map(platform_name)
  empty = names[names == '']
  lines = [
    f'{PLATFORM}, line {n}: the platform is empty; write the platform the run ran on '
    '(e.g. gpu), or leave the run out'
    for n in line_numbers(empty.index)
  ]
  spelled = {}
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
  return lines


def run_name(frame, index):
  """How a message names row `index`: its run, else its line of the file."""
  return frame.at[index, 'run'] if 'run' in frame else f'line {line_numbers([index])[0]}'


def data_config_columns(frame):
  """The config.data.* columns of `frame` that can change the data (where it lives aside)."""
  prefix = f'{record.CONFIG_PREFIX}data.'
  return [
    c
    for c in frame.columns
    if c.startswith(prefix)
    and not any(
      c[len(record.CONFIG_PREFIX) :] == f or c[len(record.CONFIG_PREFIX) :].startswith(f + '.')
      for f in record.IGNORED_FIELDS
    )
  ]


def test_set_problems(frame):
  """One line per TEST_SET field holding more than one value among the completed runs of one data
  config (module doc), naming the values, how many runs hold each and one of them."""
  done = frame[completed_rows(frame)]
  fields = [c for c in record.TEST_SET if c in done]
  if not fields or done.empty:
    return []
  config = data_config_columns(done)
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
        f'{v!r} ({(values == v).sum()} runs, e.g. {run_name(done, values.index[values == v][0])})'
        for v in pd.unique(values)[:MAX_SHOWN]
      )
      lines.append(
        f'{field}: runs of one data config were tested on different test sets '
        f'({shown}); their accuracies do not compare: analyse them apart, or rerun '
        'the odd ones on the same data'
      )
  return lines
