"""A study's whole analysis in one command (the report, its tables, the attribution and the figures)
and what the analysis commands share; light at import (docs/statistics.md "Commands").

  python -m analysis.analyse --csv results/digits_h100_cpu.csv \
    --study results/digits_h100_cpu.study.json --out DIR
"""

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional

from analysis import declaration
from runrecord import files, record

if TYPE_CHECKING:
  import pandas as pd

  from analysis.stats import Analysis

COMMAND = 'analysis.analyse'
RUNS_HELP = 'one or more roots holding the runs (local or gs://, mixed)'
# Every file analysis.analyse may write into --out (figures/NAME.pdf and .png besides).
FILES = (
  'report.md',
  'report.tex',
  'report_arms.csv',
  'report_pairs.csv',
  'report_contrasts.csv',
  'report_replicates.csv',
  'report_excluded.csv',
  'report_decomposition.csv',
  'report_agreement.csv',
  'report_calibration.csv',
  'report_train_loss.csv',
  'report_per_class.csv',
  'report_variance.csv',
  'attribution.csv',
  'attribution.md',
  'attribution_gap.csv',
  'attribution_decomposition.csv',
)
FIGURES = ('accuracy_by_arm', 'contrasts', 'gap_decomposition', 'training_curves', 'churn_ladder')


def fail(message, code=2):
  """Each line of `message` as 'error: LINE' on stderr, then exit `code` (2: bad input)."""
  for line in str(message).splitlines() or ['']:
    print(f'error: {line}', file=sys.stderr)
  sys.exit(code)


class Parser(argparse.ArgumentParser):
  """argparse whose errors are one `error: ...` line (exit 2), not its usage block."""

  def error(self, message):
    fail(f'{message}; see --help')


def number_flag(problem_of):
  """An argparse type: the number in the text (else the text), refused with problem_of's line."""

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
  """Why `value` is not a --scale factor: a finite number above 0."""
  if isinstance(value, float) and value == value and 0 < value < float('inf'):
    return None
  return (
    f'{value!r} is not a factor; give a positive number, e.g. 100 (fractions to percent) or 1 '
    '(already in percent)'
  )


margin_flag = number_flag(declaration.margin_problem)
share_flag = number_flag(declaration.share_problem)
scale_flag = number_flag(factor_problem)


def add_runs_argument(parser, required=False):
  parser.add_argument('--runs', nargs='+', required=required, metavar='ROOT', help=RUNS_HELP)


def add_study_argument(parser):
  parser.add_argument(
    '--study',
    default=None,
    help="the study's declaration: a study.json, or a config file with "
    'get_study() (default: the study.json in the roots)',
  )


def add_compare_argument(parser):
  parser.add_argument(
    '--compare',
    nargs='+',
    default=None,
    metavar='A:B',
    help='platform pairs whose gap A − B is decomposed, the first the question '
    '(default: the declared compare, else every pair, tpu before gpu before '
    'cpu); overriding the declared pairs makes the analysis exploratory',
  )


def locale_proof():
  """Let stdout and stderr print '±' under any locale (as an escape where it cannot)."""
  for stream in (sys.stdout, sys.stderr):
    if hasattr(stream, 'reconfigure'):
      stream.reconfigure(errors='backslashreplace')


@contextlib.contextmanager
def stage(command, what, quiet_s=2.0, every_s=10.0):
  """Progress on stderr for a stage that lasts over `quiet_s`: 'COMMAND: WHAT...'."""
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


@contextlib.contextmanager
def destination(target, command, may_write, **kwargs):
  """runrecord.files.Destination of `target`, held while inside (None without a target)."""
  dest = None
  try:
    if target:
      dest = files.Destination(target, command=command, may_write=may_write, **kwargs).__enter__()
    yield dest
  except files.WriteFailed as e:
    fail(e, code=1)
  except ValueError as e:
    fail(e)
  finally:
    if dest is not None:
      dest.__exit__(None, None, None)


def write_csv(tables, folder, skip_empty=(), notes=None):
  """Each DataFrame of {file name: table} as FOLDER/NAME (None, or a table without columns)."""
  paths = []
  for name, table in tables.items():
    if table is not None and len(table.columns) == 0 and name in (notes or {}):
      print(f'note: {name} not written: {notes[name]}', file=sys.stderr)
    if table is None or len(table.columns) == 0 or (table.empty and name in skip_empty):
      continue
    paths.append(os.path.join(folder, name))
    table.to_csv(paths[-1], index=False, encoding='utf-8')
  return paths


def write_text(folder, name, text):
  path = os.path.join(folder, name)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  return path


def study_analysis(
  frame: 'pd.DataFrame',
  declared: Optional[dict[str, Any]] = None,
  group_by: Sequence[str] = (),
  metric: str = record.DEFAULT_METRIC,
  margin: Optional[float] = None,
  margin_reason: Optional[str] = None,
  seed_col: Optional[str] = None,
  scale: Optional[float] = None,
  all_pairs: bool = False,
  source: str = '',
  read_predictions: Optional[Callable[['pd.DataFrame'], list[Any]]] = None,
  compare: Optional[Sequence[Sequence[str]]] = None,
) -> 'Analysis':
  """The whole analysis of a study's runs table (inputs.load_study's or inputs.read_csv's)."""
  import pandas as pd  # noqa: F811 (the statistics load when an analysis runs, not for --help)

  from analysis import agreement, attribution, inputs, stats

  declared, frame = declared or {}, inputs.split_device_kinds(frame)
  if not inputs.is_accuracy(metric) and margin is None:  # a margin in pp is an accuracy's
    raise ValueError(
      f'--margin: {metric} is not an accuracy by name (no "acc"), so neither the default nor a '
      "declared margin (pp) applies to it; give --margin in the metric's own units"
    )
  margin, why = stats.margin_choice(
    margin, margin_reason, declared.get('margin'), declared.get('margin_reason')
  )
  declares = bool(declared.get('factors') and declared.get('reference'))
  if compare or declared.get('compare'):
    flag = '--compare' if compare else 'study compare'
    kinds = declared.get('device_kinds') or 'split'
    attribution.check_compare(frame, compare or declared['compare'], declares, flag, kinds)
  numbers = stats.arms_and_pairs(
    frame, group_by, metric, margin, why, seed_col, scale, all_pairs=all_pairs or not declares
  )
  out = stats.Analysis(
    **vars(numbers), declared=declared, source=source, software=inputs.software(numbers.runs)
  )
  if declares:
    out = dataclasses.replace(out, arm_info=stats.arm_levels(out, declared))
    out = dataclasses.replace(
      out,
      contrasts=stats.contrast_table(out, declared),
      noise=stats.noise_floors(
        out.runs,
        declared.get('noise_arm') or {},
        declared.get('noise_of') or declared.get('reference') or {},
        list(stats.factor_columns(out.runs, declared).values()),
      ),
      attribution=attribution.declared_attribution(
        frame, declared, out.metric, seed_col, margin, why, source, compare
      ),
    )
  # The run folders' saved predictions, read by `read_predictions`; a CSV's rows have none.
  agree = agreement.from_analysis(out, stats.arm_short_labels(out), read=read_predictions)
  sc = stats.scope(out, declared, compare)
  out = dataclasses.replace(out, agreement=agree, scope=sc)
  if sc.confirmatory is False and sc.declared_seeds_present and inputs.is_accuracy(metric):
    seeds = pd.to_numeric(frame[seed_col or 'seed'], errors='coerce')
    kept, margin = frame[seeds.isin(sc.declared_seeds)], declared.get('margin')
    rest = (seed_col, scale, all_pairs, source)
    confirmatory = study_analysis(kept, declared, group_by, metric, margin, None, *rest)
    out = dataclasses.replace(out, confirmatory=confirmatory)
  return out


def parse_args(argv):
  p = Parser(
    prog='python -m analysis.analyse',
    description="A study's whole analysis in one command: the report (the answer "
    'first), its tables, the attribution and the figures, from one or more roots of '
    'runs (local and gs://, mixed) or a CSV.',
  )
  src = p.add_mutually_exclusive_group(required=True)
  add_runs_argument(src)
  src.add_argument('--csv', help='a CSV of results, one row per run (analysis.export writes one)')
  add_study_argument(p)
  add_compare_argument(p)
  p.add_argument(
    '--all-pairs',
    action='store_true',
    help='also test every pair of arms (Holm over all pairs, apart from the declared family)',
  )
  p.add_argument(
    '--group-by',
    nargs='+',
    default=[],
    help='columns defining an arm, e.g. platform compute_dtype or any config.* field '
    '(default: platform, device kind, every requested numerics field and every '
    'config field that differs between the runs; runrecord.rules.arm_columns)',
  )
  p.add_argument(
    '--metric',
    default=record.DEFAULT_METRIC,
    help=f'the column compared between arms (default {record.DEFAULT_METRIC}; a CSV: '
    'any numeric column; accuracies in [0, 1] are reported in percent)',
  )
  p.add_argument(
    '--margin',
    type=margin_flag,
    default=None,
    help=f'equivalence margin, pp (default: the declared one, else {declaration.DEFAULT_MARGIN:g})',
  )
  p.add_argument('--margin-reason', default=None, help='why --margin (printed with it)')
  p.add_argument(
    '--seed-col',
    default=None,
    help="column holding each run's seed (default 'seed' when present; without one "
    'every row is its own run, unpaired)',
  )
  p.add_argument(
    '--scale',
    type=scale_flag,
    default=None,
    help='multiply the metric by this (default: 100 for accuracies in [0, 1])',
  )
  p.add_argument(
    '--format',
    choices=('md', 'latex', 'csv'),
    default='md',
    help='what is printed (with --out every format is written)',
  )
  p.add_argument(
    '--out',
    help='folder for the report, its tables, the attribution and figures/: '
    + ', '.join(FILES)
    + '; figures/'
    + ', figures/'.join(FIGURES)
    + ' (.pdf and .png)',
  )
  return p.parse_args(argv)


def load(args):
  """(runs table, histories, declaration, source) of the command line."""
  from analysis import inputs

  if args.runs:
    return (*inputs.load_study(args.runs, args.study), ' '.join(args.runs))
  declared = declaration.load(args.study) if args.study else {}
  names = list(args.group_by) + list(declared.get('factors') or [])  # read whatever their kind
  for key in ('reference', 'noise_arm', 'native'):
    arm = declared.get(key) or {}
    names += list(arm) if isinstance(arm, dict) else [str(a).split('=')[0] for a in arm]
  frame = inputs.read_csv(args.csv, args.metric, args.seed_col, names, scale=args.scale)
  declaration.check_levels(declared, frame, args.study)
  return frame, frame.iloc[:0][['run']], declared, args.csv


def render(out, fmt):
  """report.render, the LaTeX labels made the study's own (tab:NAME -> tab:PREFIX-NAME)."""
  from analysis import report

  text = report.render(out, fmt)
  if fmt != 'latex':
    return text
  names = [os.path.splitext(os.path.basename(s.rstrip('/')))[0] for s in out.source.split()]
  prefix = re.sub(r'[^A-Za-z0-9]+', '-', '-'.join(names)).strip('-') or 'study'  # CSV stem, roots
  return text.replace(r'\label{tab:', rf'\label{{tab:{prefix}-')


def tables(out):
  """{file name: table} of the analysis's CSV files (None: not written)."""
  from analysis import attribution

  ag, att = out.agreement, attribution.tables(out.attribution)
  return {
    'report_arms.csv': out.arms,
    'report_pairs.csv': out.pairs,
    'report_contrasts.csv': out.contrasts,
    'report_replicates.csv': out.replicates,
    'report_excluded.csv': out.excluded,
    'report_decomposition.csv': att['attribution_decomposition.csv'],
    'report_agreement.csv': ag.table if ag else None,
    'report_calibration.csv': ag.calibration if ag else None,
    'report_train_loss.csv': ag.train_loss if ag else None,
    'report_per_class.csv': ag.per_class if ag else None,
    'report_variance.csv': ag.variance if ag else None,
    **att,
  }


# Not written when they have no rows.
SKIP_EMPTY = {'report_calibration.csv', 'report_train_loss.csv', 'report_per_class.csv'}
SKIP_EMPTY |= {'report_variance.csv'}
NOTES = {
  'report_pairs.csv': 'no pairs tested (declared contrasts only; --all-pairs tests every pair)'
}


def write(out, hist, folder, rendered=None):
  """Every file of the analysis `out` and its figures (FIGURES, into folder/figures); the paths."""
  from analysis import figures, inputs, report

  rendered = rendered or {}
  paths = [
    write_text(folder, f'report.{e}', rendered.get(f) or render(out, f))
    for f, e in (('md', 'md'), ('latex', 'tex'))
  ]
  paths += write_csv(tables(out), folder, SKIP_EMPTY, NOTES)
  if out.attribution:
    paths.append(write_text(folder, 'attribution.md', report.attribution_report(out.attribution)))
  os.makedirs(os.path.join(folder, 'figures'))
  steps = inputs.steps_frame(out.runs['run'])
  return paths + figures.study_figures(out, hist, steps, os.path.join(folder, 'figures'))


def may_write():
  """The names analysis.analyse may write into --out (runrecord.files.Destination's `may_write`)."""
  return list(FILES) + [f'figures/{n}.{e}' for n in FIGURES for e in ('pdf', 'png')]


def main(argv=None):
  locale_proof()
  args = parse_args(argv)
  with destination(args.out, COMMAND, may_write()) as dest:  # refused before any compute
    from analysis import inputs

    with stage(COMMAND, f'reading {" ".join(args.runs) if args.runs else args.csv}'):
      frame, hist, declared, source = load(args)
    with stage(COMMAND, f'{len(frame)} runs: the contrasts, the gap, the attribution, agreement'):
      given = (args.group_by, args.metric, args.margin, args.margin_reason, args.seed_col)
      rest = (args.scale, args.all_pairs, source)
      read = inputs.read_predictions if args.runs else None
      compare = declaration.parse_compare(args.compare)
      out = study_analysis(frame, declared, *given, *rest, read_predictions=read, compare=compare)
    with stage(COMMAND, 'the report' + (f' and its files into {args.out}' if args.out else '')):
      for arm in out.small['arm']:
        print(
          f'warning: arm {arm!r} has n < 2 completed runs: reported, its tests skipped',
          file=sys.stderr,
        )
      rendered = {}
      if args.format == 'csv':
        for name, table in tables(out).items():
          if table is not None and len(table.columns):
            head = name[:-4].removeprefix('report_')
            sys.stdout.write(f'# {head}\n{table.to_csv(index=False)}\n')
      else:
        rendered[args.format] = render(out, args.format)
        sys.stdout.write(rendered[args.format])
      written = dest.write(lambda folder: write(out, hist, folder, rendered)) if dest else []
  for path in written:
    print(f'wrote {path}', file=sys.stderr)


if __name__ == '__main__':
  main()
