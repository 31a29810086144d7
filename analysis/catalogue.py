"""Every file the analysis commands write into --out, one list each: FIGURES (NAME.pdf and
NAME.png: what each shows, the function that draws it, the commands that write it) and FILES (the
reports and tables: what each holds, where its content comes from, the commands that write it).
The commands write from these lists (write), their --out help and docs/statistics.md's table of
figures and files are made from them (markdown, update_docs), and
tests/integration/test_catalogue.py checks
that what each command writes is exactly what they list, and that the docs' table is theirs.

A new figure: a function `draw(given, folder, name) -> [paths]` in its analysis/figures/ module
([] when the data lack it) and one Figure below; a new table: one OutputFile below (its content a
field of the result, analysis/numbers/result.py); then update_docs() rewrites the docs' table.

Kept light (no pandas or matplotlib): the commands' --help reads it before their heavy imports.
"""

import dataclasses
import importlib
import os
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # for the annotations only: the commands' --help must not import pandas
  import pandas as pd

  from analysis.analyse import Analysis, Attribution

ANALYSE, ATTRIBUTE, DRAW = 'analysis.analyse', 'analysis.attribute', 'analysis.draw'
COMMANDS = (ANALYSE, ATTRIBUTE, DRAW)
STUDY = (ANALYSE, DRAW)
# Where each command puts its figures, under its --out.
FIGURE_FOLDERS = {ANALYSE: 'figures', ATTRIBUTE: '', DRAW: ''}
FIGURE_FORMATS = ('pdf', 'png')


@dataclasses.dataclass
class Given:
  """What a command hands the writers (None: it has none). `result`: the study's
  analysis.numbers.result.Analysis (analysis.attribute has none); `attribution`: its
  result.Attribution; `histories`, `steps`: the runs' per-epoch and per-step tables (the training
  curves); `report_md`, `report_tex`, `attribution_md`: the texts the command rendered;
  `attribution_terms`, `decomposition`: the attribution's CSV tables (analysis/attribute.py
  tables)."""

  result: Optional['Analysis'] = None
  attribution: Optional['Attribution'] = None
  histories: Optional['pd.DataFrame'] = None
  steps: Optional['pd.DataFrame'] = None
  report_md: Optional[str] = None
  report_tex: Optional[str] = None
  attribution_md: Optional[str] = None
  attribution_terms: Optional['pd.DataFrame'] = None
  decomposition: Optional['pd.DataFrame'] = None


@dataclasses.dataclass(frozen=True)
class Figure:
  """`name`: the files NAME.pdf and NAME.png; `shows`: what it shows; `draw`: 'module:function',
  function(given, folder, name) -> the paths written ([] when the data lack it); `commands`: the
  commands that write it (into FIGURE_FOLDERS[command] under --out)."""

  name: str
  shows: str
  draw: str
  commands: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class OutputFile:
  """`name`: the file under --out; `holds`: what it holds; `source`: the dotted path of its content
  in Given (a DataFrame: written as CSV; a text: as is; None anywhere on the path: not written);
  `commands`: the commands that write it; `empty`: a table without rows is 'kept' (its header
  written) or 'skipped'; a table without columns is not written (`note`: why, said on stderr)."""

  name: str
  holds: str
  source: str
  commands: tuple[str, ...]
  empty: str = 'keep'
  note: str = ''


FIGURES: tuple[Figure, ...] = (
  Figure(
    'accuracy_by_arm',
    'the final metric per arm: every seed (colour = platform), mean ± '
    '95% CI, quartile boxes from 10 seeds per arm (two columns)',
    'analysis.figures:accuracy_by_arm',
    STUDY,
  ),
  Figure(
    'contrasts',
    'each declared contrast (arm − reference, per platform; every pair '
    "without a declaration) ± 95% and 90% CI against the margin and each platform's noise floor "
    '(one column)',
    'analysis.figures:contrasts',
    STUDY,
  ),
  Figure(
    'gap_decomposition',
    'per platform pair, G = fid_A − fid_B + N + P, each part as it '
    "enters G, and the residual R, with the pair's verdict (one column)",
    'analysis.figures:gap_decomposition',
    STUDY + (ATTRIBUTE,),
  ),
  Figure(
    'training_curves',
    'training loss per logged step and test accuracy over the last half '
    'of the epochs, mean per arm and platform, ± 1 sd up to 4 curves (two columns)',
    'analysis.figures:training_curves',
    STUDY,
  ),
  Figure(
    'churn_ladder',
    "the churn ladder: each agreement row's mean churn over seeds with its "
    '95% t-Wilson interval and the per-seed values (two columns)',
    'analysis.figures:churn_ladder',
    STUDY,
  ),
  Figure(
    'attribution_forest',
    'every component of each platform gap and the main effects of '
    'the other factors, ± 95% CI (one column; analysis.analyse leaves it out: its '
    'contrasts and gap figures show the same)',
    'analysis.figures:attribution_forest',
    (ATTRIBUTE,),
  ),
)

FILES: tuple[OutputFile, ...] = (
  OutputFile(
    'report.md',
    'the report: the answer on one page, the setup, why each verdict, every table',
    'report_md',
    (ANALYSE,),
  ),
  OutputFile('report.tex', 'the booktabs tables a paper can \\input', 'report_tex', (ANALYSE,)),
  OutputFile(
    'report_arms.csv',
    'one row per arm: n, mean, sd, 95% CI, determinism, seeds',
    'result.arms',
    (ANALYSE,),
  ),
  OutputFile(
    'report_pairs.csv',
    'one row per pair of arms: every test, its CIs, power and '
    'verdict (written when every pair is tested)',
    'result.pairs',
    (ANALYSE,),
    note='no pairs tested (declared contrasts only; --all-pairs tests every pair)',
  ),
  OutputFile(
    'report_contrasts.csv',
    'one row per declared contrast: the same columns',
    'result.contrasts',
    (ANALYSE,),
  ),
  OutputFile(
    'report_replicates.csv',
    'one row per arm and seed run more than once',
    'result.replicates',
    (ANALYSE,),
  ),
  OutputFile(
    'report_excluded.csv',
    'the runs left out, with their status and reason',
    'result.excluded',
    (ANALYSE,),
  ),
  OutputFile(
    'report_decomposition.csv',
    "one row per platform pair: the gap decomposition's verdict, share and seeds",
    'decomposition',
    (ANALYSE,),
  ),
  OutputFile(
    'report_agreement.csv',
    "the churn ladder's rows (analysis/numbers/agreement.py)",
    'result.agreement.table',
    (ANALYSE,),
  ),
  OutputFile(
    'report_calibration.csv',
    'per run: ECE and its bins',
    'result.agreement.calibration',
    (ANALYSE,),
    empty='skip',
  ),
  OutputFile(
    'report_train_loss.csv',
    "per arm: the final training loss and its ratio to the lowest arm's",
    'result.agreement.train_loss',
    (ANALYSE,),
    empty='skip',
  ),
  OutputFile(
    'report_per_class.csv',
    'per compared pair and class: the accuracy difference, Holm over the classes',
    'result.agreement.per_class',
    (ANALYSE,),
    empty='skip',
  ),
  OutputFile(
    'report_variance.csv',
    'per arm: the variance between runs split by its source',
    'result.agreement.variance',
    (ANALYSE,),
    empty='skip',
  ),
  OutputFile(
    'attribution.csv',
    'the factor effects, one row per term (exact columns)',
    'attribution_terms',
    (ANALYSE, ATTRIBUTE),
  ),
  OutputFile('attribution.md', 'the attribution in words', 'attribution_md', (ANALYSE, ATTRIBUTE)),
  OutputFile(
    'attribution_gap.csv',
    "every component of each platform gap's decomposition",
    'attribution.gap',
    (ANALYSE, ATTRIBUTE),
  ),
  OutputFile(
    'attribution_decomposition.csv',
    'one row per platform pair: verdict, share, seeds',
    'decomposition',
    (ANALYSE, ATTRIBUTE),
  ),
)


def figures(command: str) -> list[Figure]:
  """The Figures `command` writes."""
  return [f for f in FIGURES if command in f.commands]


def files(command: str) -> list[OutputFile]:
  """The OutputFiles `command` writes."""
  return [f for f in FILES if command in f.commands]


def resolve(spec):
  """The function a 'module:function' spec names."""
  module, _, name = spec.partition(':')
  return getattr(importlib.import_module(module), name)


def content(given, source):
  """The value at the dotted path `source` of `given` (attributes, or keys of a dict), or None."""
  value = given
  for part in source.split('.'):
    value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    if value is None:
      return None
  return value


def write_file(entry, value, folder):
  """Write one OutputFile's value into `folder`; its path, or None when it is not written."""
  if not isinstance(value, str):
    if len(value.columns) == 0:
      if entry.note:
        print(f'note: {entry.name} not written: {entry.note}', file=sys.stderr)
      return None
    if value.empty and entry.empty == 'skip':
      return None
  path = os.path.join(folder, entry.name)
  if isinstance(value, str):
    with open(path, 'w', encoding='utf-8') as f:
      f.write(value)
  else:
    value.to_csv(path, index=False, encoding='utf-8')
  return path


def write(
  command: str, given: Given, folder: str, only: Optional[Collection[str]] = None
) -> list[str]:
  """Every file and figure of `command` that `given` has content for, into `folder`.

  Args:
    command: one of COMMANDS; its FILES and FIGURES are written.
    given: what the command hands the writers; an entry whose content is None is not written.
    folder: the command's --out (figures go into FIGURE_FOLDERS[command] under it).
    only: the names (OutputFile.name, Figure.name) to restrict to; None: all.

  Returns:
    The paths written (a figure: its .pdf and .png).
  """
  os.makedirs(folder, exist_ok=True)
  paths = []
  for entry in files(command):
    value = content(given, entry.source) if only is None or entry.name in only else None
    path = None if value is None else write_file(entry, value, folder)
    paths += [path] if path else []
  where = os.path.join(folder, FIGURE_FOLDERS[command])
  for figure in figures(command):
    if only is None or figure.name in only:
      os.makedirs(where, exist_ok=True)
      paths += resolve(figure.draw)(given, where, figure.name) or []
  return paths


def csv_tables(command, given):
  """{name: DataFrame} of the CSV tables of `command` that `given` has (`--format csv`): each
  file's name without 'report_' and '.csv'."""
  tables = {}
  for entry in files(command):
    value = content(given, entry.source)
    if entry.name.endswith('.csv') and value is not None and len(value.columns):
      tables[entry.name[:-4].removeprefix('report_')] = value
  return tables


def names(command):
  """'report.md, report_arms.csv, ...; figures/accuracy_by_arm, ...' : what `command` may write
  (its --out help)."""
  folder = FIGURE_FOLDERS[command]
  shown = ', '.join(f.name for f in files(command))
  drawn = ', '.join(f'{folder + "/" if folder else ""}{f.name}' for f in figures(command))
  return '; '.join(p for p in (shown, drawn and f'{drawn} (.pdf and .png)') if p)


DOCS = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'docs', 'statistics.md'
)
FIRST = (
  '<!-- catalogue: generated from analysis/catalogue.py markdown(); tests/integration/'
  'test_catalogue.py checks it -->'
)
LAST = '<!-- catalogue: end -->'


def markdown() -> str:
  """The docs' table of every figure and file (docs/statistics.md, between FIRST and LAST)."""

  def short(commands):
    return ', '.join(c.removeprefix('analysis.') for c in commands)

  lines = ['| file | what it holds | written by |', '| --- | --- | --- |']
  lines += [f'| `{f.name}` | {f.holds} | {short(f.commands)} |' for f in FILES]
  lines += [
    f'| `{f.name}.pdf`, `.png` | {f.shows}; drawn by `{f.draw}` | {short(f.commands)} |'
    for f in FIGURES
  ]
  return '\n'.join(lines) + '\n'


def docs_table(page):
  """The table between FIRST and LAST of the Markdown text `page`, or None without the markers."""
  start, end = page.find(FIRST), page.find(LAST)
  return page[start + len(FIRST) : end].strip('\n') + '\n' if 0 <= start < end else None


def update_docs(path=DOCS):
  """Write markdown() between the markers of the page at `path` (after adding a figure or file:
  python -c 'from analysis import catalogue; catalogue.update_docs()')."""
  with open(path, encoding='utf-8') as f:
    page = f.read()
  if docs_table(page) is None:
    raise ValueError(f'{path}: no table marked {FIRST!r} ... {LAST!r}; add the two markers')
  start, end = page.find(FIRST) + len(FIRST), page.find(LAST)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(page[:start] + '\n\n' + markdown() + '\n' + page[end:])
