"""The study's figures as a command (analysis/figures/study_figures.py says what each shows).

  python -m analysis.draw --runs ROOT [ROOT ...] --out FIGURES [--study FILE] [--margin 0.5]

Bad input: one `error: ...` line, exit code 2, nothing drawn. The figures are drawn into a staging
folder and moved into place at once, under a lock on --out (analysis/output.py).
"""

from analysis import arguments, cli
from analysis.figures import study_figures
from analysis.inputs import results
from analysis.numbers import answer


def parse_args(argv):
  """The command line (analysis/arguments.py: parsed there before this module's imports when run
  as `python -m analysis.draw`)."""
  return arguments.draw(argv)


def main(argv=None):
  args = parse_args(argv)
  with cli.destination(args.out) as dest:  # locked, drawn at once (analysis/output.py)
    runs, hist, declared = results.load_study(args.runs, args.study)
    out = answer.study_analysis(runs, declared, args.group_by, args.metric, args.margin,
                         args.margin_reason)
    written = dest.write(lambda folder: study_figures.make_all(out, hist, folder))
  for path in written:
    print(path)


if __name__ == '__main__':
  main()
