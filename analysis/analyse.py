"""A study's whole analysis in one command: the report (the answer first), its tables, the
attribution and the figures, from one or more roots of runs (local and gs://, mixed) or a CSV.

  python -m analysis.analyse --runs runs/study --out runs/study          # what sweeps.run_study runs
  python -m analysis.analyse --runs gs://bucket/gpu runs/cpu --out out   # two platforms' roots
  python -m analysis.analyse --csv results/digits_h100_cpu.csv --study results/digits_h100_cpu.study.json
  python -m analysis.analyse --csv published.csv --group-by platform --metric accuracy

The tests are the study's declared contrasts (analysis/numbers/contrasts.py): the declaration
written into the root before the first run (study.json, analysis/inputs/declaration.py), or --study;
every pair of arms only with --all-pairs (or when nothing is declared). Without --out the report is
printed (--format md: the whole report; latex: its booktabs tables; csv: its tables). With --out DIR
it is printed and written: DIR/report.md, report.tex, report_<table>.csv, attribution.md,
attribution.csv, attribution_gap.csv and attribution_decomposition.csv (two platforms), DIR/figures/
(analysis/figures/study_figures.py), and the agreement files (analysis/numbers/agreement_section.py:
report_agreement.csv, report_calibration.csv, report_train_loss.csv, report_per_class.csv,
report_variance.csv where they have rows, figures/churn_ladder.*); a table without columns
(report_pairs.csv when only the declared contrasts are tested) is not written, and a line on stderr
says so. The LaTeX tables' labels carry the source's name (tab:digits-h100-cpu-contrasts), so that
the report.tex of two studies can be \\input into one paper. Bad input: `error: ...` lines (the last
one too), exit code 2, nothing written; output prints under any locale (analysis/cli.py). The files
are written into a staging folder and moved into place when all are written, under a lock on --out
(analysis/output.py): a second analysis on the same --out is refused in one line while the first
runs, and a failed write (a full disk: exit 1, one line) leaves the previous report whole.
"""

import os
import re
import sys

import pandas as pd

from analysis import arguments, attribute, cli, output
from analysis.figures import churn_ladder, naming, study_figures
from analysis.inputs import csv_input, declaration, results, run_predictions
from analysis.numbers import answer
from analysis.words import report

COMMAND = 'analysis.analyse'  # how its progress lines name it
# The agreement section's tables (analysis/numbers/agreement_section.py) and their files.
AGREEMENT_FILES = {'table': 'report_agreement.csv', 'calibration': 'report_calibration.csv',
                   'train_loss': 'report_train_loss.csv', 'per_class': 'report_per_class.csv',
                   'variance': 'report_variance.csv'}


def parse_args(argv):
  """The command line (analysis/arguments.py: parsed there before this module's imports when run
  as `python -m analysis.analyse`)."""
  return arguments.analyse(argv)


def named_columns(args, declared):
  """The columns the command line and the declaration name (--group-by, the declared factors and
  the factors of its reference, noise and native arms): read from a CSV whatever their kind."""
  names = list(args.group_by) + list(declared.get('factors') or [])
  for key in ('reference', 'noise_arm', 'native'):
    arm = declared.get(key) or {}
    names += list(arm) if isinstance(arm, dict) else [str(a).split('=')[0] for a in arm]
  return names


def load(args):
  """(runs table, histories, declaration, source) of the command line."""
  if args.runs:
    return (*results.load_study(args.runs, args.study), ' '.join(args.runs))
  declared = declaration.load(args.study) if args.study else {}
  frame = csv_input.read_csv(args.csv, args.metric, args.seed_col, named_columns(args, declared),
                         scale=args.scale)
  declaration.check_levels(declared, frame, args.study)
  return frame, frame.iloc[:0][['run']], declared, args.csv


def label_prefix(source):
  """The name the LaTeX labels of a study carry: its CSV's stem, or its roots' last folders
  ('digits_h100_cpu', 'h100-cpu'), in letters, digits and '-' only."""
  names = [os.path.splitext(os.path.basename(s.rstrip('/')))[0] for s in source.split()]
  return re.sub(r'[^A-Za-z0-9]+', '-', '-'.join(names)).strip('-') or 'study'


def render(out, fmt):
  """report.render, the LaTeX labels made the study's own (tab:NAME -> tab:PREFIX-NAME, label_prefix
  of the source): two studies' report.tex \\input into one paper repeat no \\label."""
  text = report.render(out, fmt)
  if fmt != 'latex':
    return text
  return text.replace(r'\label{tab:', rf'\label{{tab:{label_prefix(out.source)}-')


def write_csv_tables(out, out_dir):
  """DIR/report_<table>.csv for each table of the report that has columns (report.csv_tables; an
  empty table keeps its header); one without columns (no pair tested) is not written and a line on
  stderr says so. Returns the paths written."""
  files = []
  for name, table in report.csv_tables(out).items():
    if table.columns.empty:
      print(f'note: report_{name}.csv not written: no {name} tested (declared contrasts only; '
            '--all-pairs tests every pair)' if name == 'pairs' else
            f'note: report_{name}.csv not written: the table is empty', file=sys.stderr)
      continue
    files.append(os.path.join(out_dir, f'report_{name}.csv'))
    table.to_csv(files[-1], index=False, encoding='utf-8')
  return files


def write(out, hist, out_dir, rendered=None):
  """Every file of the analysis into out_dir (see module doc); returns their paths. `rendered`:
  {format: text} of the report already rendered, not rendered again."""
  rendered = rendered or {}
  os.makedirs(out_dir, exist_ok=True)
  files = []
  for fmt, ext in (('md', 'md'), ('latex', 'tex')):
    files.append(os.path.join(out_dir, f'report.{ext}'))
    report.write_text(rendered[fmt] if fmt in rendered else render(out, fmt), files[-1])
  files += write_csv_tables(out, out_dir)
  if out.attribution:
    files += attribute.write_tables(out.attribution, out_dir)
  files += study_figures.make_all(out, hist, os.path.join(out_dir, 'figures'))
  return files + (write_agreement(out.agreement, out_dir, naming.context(out, 150))
                  if out.agreement else [])


def write_agreement(section, out_dir, context=None):
  """The agreement section's non-empty CSVs into out_dir (report_agreement.csv always) and the
  churn ladder (subtitled with `context`) into out_dir/figures when it has rows; returns the paths
  written."""
  paths = []
  for key, name in AGREEMENT_FILES.items():
    frame = getattr(section, key)
    if key == 'table' or not frame.empty:
      paths.append(os.path.join(out_dir, name))
      pd.DataFrame(frame).to_csv(paths[-1], index=False)
  if not section.table.empty:
    os.makedirs(os.path.join(out_dir, 'figures'), exist_ok=True)
    paths += churn_ladder.churn_ladder(section.table, os.path.join(out_dir, 'figures'), context)
  return paths


def publish(out, hist, fmt='md', out_dir=None, dest=None):
  """Warn of arms with n < 2, print the report in `fmt` and, with out_dir, write every file into
  it (write), all at once and under its lock (analysis/output.py; `dest`: its Destination, already
  held); returns the paths written. output.Busy / output.WriteFailed (ValueErrors, one line) when
  another command holds out_dir or a write fails: the previous report is then whole."""
  for arm in out.small['arm']:
    print(f'warning: arm {arm!r} has n < 2 completed runs: reported, its tests skipped',
          file=sys.stderr)
  text = report.write_report(out, fmt) if fmt == 'csv' else report.write_text(render(out, fmt))
  if not out_dir:
    return []
  if dest is None:
    with output.Destination(out_dir) as held:
      return held.write(lambda folder: write(out, hist, folder, {fmt: text}))
  return dest.write(lambda folder: write(out, hist, folder, {fmt: text}))


def analysis_and_histories(args):
  """analysis/answer.study_analysis's Analysis for the command line, with the histories; each stage that
  lasts over 2 s says so on stderr (cli.stage)."""
  with cli.stage(COMMAND, f'reading {" ".join(args.runs) if args.runs else args.csv}'):
    frame, hist, declared, source = load(args)
  with cli.stage(COMMAND, f'{len(frame)} runs: testing the contrasts, the gap decomposition, the '
                 'attribution and the agreement'):
    out = answer.study_analysis(frame, declared, args.group_by, args.metric, args.margin,
                         args.margin_reason, args.seed_col, args.scale, args.all_pairs, source,
                         read_predictions=run_predictions.read_runs if args.runs else None,
                         compare=declaration.parse_compare(args.compare))
  return out, hist


def main(argv=None):
  cli.locale_proof()
  args = parse_args(argv)
  try:
    cli.check_out_folder(args.out)
  except ValueError as e:
    cli.fail(e)
  with cli.destination(args.out) as dest:  # --out locked before any compute, written at once
    out, hist = analysis_and_histories(args)
    with cli.stage(COMMAND, 'the report' + (f', its tables, the attribution and the figures into '
                                              f'{args.out}' if args.out else '')):
      written = publish(out, hist, args.format, args.out, dest)
  for path in written:
    print(f'wrote {path}', file=sys.stderr)


if __name__ == '__main__':
  main()
