"""A study's whole analysis in one command: the report (the answer first), its tables, the
attribution and the figures, from one or more roots of runs (local and gs://, mixed) or a CSV.

  python -m analysis.analyse --runs runs/study --out runs/study   # what sweeps.run_study runs
  python -m analysis.analyse --runs gs://bucket/gpu runs/cpu --out out   # two platforms' roots
  python -m analysis.analyse --csv results/digits_h100_cpu.csv \
    --study results/digits_h100_cpu.study.json
  python -m analysis.analyse --csv published.csv --group-by platform --metric accuracy

The tests are the study's declared contrasts (the root's study.json, or --study; every pair of arms
with --all-pairs or without a declaration). Without --out the report is printed (--format md,
latex: its booktabs tables, csv: its tables); with --out DIR it is printed and every file and
figure analysis/catalogue.py lists for this command is written into DIR (figures into DIR/figures),
at once and under a lock (analysis/output.py). What each file holds: docs/statistics.md "Report
and figures"; bad input and failed writes: docs/statistics.md and analysis/cli.py.
"""

import dataclasses
import os
import re
import sys

from analysis import arguments, attribute, catalogue, cli, declaration, inputs, output
from analysis.numbers import answer
from analysis.words import report

COMMAND = catalogue.ANALYSE  # how its progress lines name it


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
    return (*inputs.load_study(args.runs, args.study), ' '.join(args.runs))
  declared = declaration.load(args.study) if args.study else {}
  frame = inputs.read_csv(
    args.csv, args.metric, args.seed_col, named_columns(args, declared), scale=args.scale
  )
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


def given(out, hist, rendered=None):
  """What the writers of analysis/catalogue.py read from the analysis `out`: its result, the
  attribution's tables, the histories, the runs' steps (read from their folders) and the report
  in Markdown and LaTeX (`rendered`: {format: text} already rendered, not rendered again)."""
  rendered = rendered or {}

  def text(fmt):
    return rendered[fmt] if fmt in rendered else render(out, fmt)

  parts = attribute.given(out.attribution, out) if out.attribution else catalogue.Given(result=out)
  return dataclasses.replace(
    parts,
    histories=hist,
    steps=inputs.steps_frame(out.runs['run']),
    report_md=text('md'),
    report_tex=text('latex'),
  )


def write(out, hist, out_dir, rendered=None):
  """Every file and figure analysis/catalogue.py lists for analysis.analyse, into out_dir; returns
  their paths."""
  return catalogue.write(catalogue.ANALYSE, given(out, hist, rendered), out_dir)


def print_csv_tables(out):
  """`--format csv`: each CSV table of the report (catalogue.csv_tables), '# NAME' then its rows."""
  parts = attribute.given(out.attribution, out) if out.attribution else catalogue.Given(result=out)
  for name, table in catalogue.csv_tables(catalogue.ANALYSE, parts).items():
    sys.stdout.write(f'# {name}\n{table.to_csv(index=False)}\n')


def publish(out, hist, fmt='md', out_dir=None, dest=None):
  """Warn of arms with n < 2, print the report in `fmt` and, with out_dir, write every file into
  it (write), all at once and under its lock (analysis/output.py; `dest`: its Destination, already
  held); returns the paths written. output.Busy / output.WriteFailed (ValueErrors, one line) when
  another command holds out_dir or a write fails: the previous report is then whole."""
  for arm in out.small['arm']:
    print(
      f'warning: arm {arm!r} has n < 2 completed runs: reported, its tests skipped', file=sys.stderr
    )
  rendered = {}
  if fmt == 'csv':
    print_csv_tables(out)
  else:
    rendered[fmt] = render(out, fmt)
    sys.stdout.write(rendered[fmt])
  if not out_dir:
    return []
  if dest is None:
    with output.Destination(out_dir) as held:
      return held.write(lambda folder: write(out, hist, folder, rendered))
  return dest.write(lambda folder: write(out, hist, folder, rendered))


def analysis_and_histories(args):
  """(analysis.numbers.answer.study_analysis's Analysis, the histories) of the command line;
  each stage that lasts over 2 s says so on stderr (cli.stage)."""
  with cli.stage(COMMAND, f'reading {" ".join(args.runs) if args.runs else args.csv}'):
    frame, hist, declared, source = load(args)
  with cli.stage(
    COMMAND,
    f'{len(frame)} runs: testing the contrasts, the gap decomposition, the '
    'attribution and the agreement',
  ):
    out = answer.study_analysis(
      frame,
      declared,
      args.group_by,
      args.metric,
      args.margin,
      args.margin_reason,
      args.seed_col,
      args.scale,
      args.all_pairs,
      source,
      read_predictions=inputs.read_predictions if args.runs else None,
      compare=declaration.parse_compare(args.compare),
    )
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
    with cli.stage(
      COMMAND,
      'the report'
      + (f', its tables, the attribution and the figures into {args.out}' if args.out else ''),
    ):
      written = publish(out, hist, args.format, args.out, dest)
  for path in written:
    print(f'wrote {path}', file=sys.stderr)


if __name__ == '__main__':
  main()
