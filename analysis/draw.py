"""The study's figures as a command (analysis/figures/study_figures.py says what each shows).

  python -m analysis.draw --runs ROOT [ROOT ...] --out FIGURES [--study FILE] [--margin 0.5]

Bad input: one `error: ...` line, exit code 2, nothing drawn. The figures are drawn into a staging
folder and moved into place at once, under a lock on --out (analysis/output.py).
"""

import argparse

from analysis import cli
from analysis.figures import study_figures
from analysis.inputs import declaration, results
from analysis.numbers import answer, stats


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m analysis.draw', description=__doc__.split('\n')[0])
  results.add_runs_argument(p, required=True)
  p.add_argument('--out', required=True, help='folder for the PDF and PNG files')
  declaration.add_study_argument(p)
  p.add_argument('--group-by', nargs='+', default=[],
                 help='columns defining an arm (default: platform, device kind, every requested '
                      'numerics field and every config field that differs between the runs)')
  p.add_argument('--metric', default=stats.DEFAULT_METRIC,
                 help=f'the final metric per arm (default {stats.DEFAULT_METRIC})')
  p.add_argument('--margin', type=float, default=None,
                 help='equivalence margin, pp (default: the declared one)')
  p.add_argument('--margin-reason', default=None, help='why this margin')
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  with cli.destination(args.out) as dest:  # locked, drawn at once (analysis/output.py)
    runs, hist, declared = results.load_study(args.runs, args.study)
    out = answer.analyse(runs, declared, args.group_by, args.metric, args.margin,
                         args.margin_reason)
    written = dest.write(lambda folder: study_figures.make_all(out, hist, folder))
  for path in written:
    print(path)


if __name__ == '__main__':
  main()
