"""The study's figures as a command: those analysis/catalogue.py lists for analysis.draw (what
each shows is said there), the same figures analysis.analyse draws into its figures/.

  python -m analysis.draw --runs ROOT [ROOT ...] --out FIGURES [--study FILE] [--margin 0.5]

Bad input: one `error: ...` line, exit code 2, nothing drawn. The figures are drawn into a staging
folder and moved into place at once, under a lock on --out (analysis/output.py).
Reference: docs/statistics.md "Commands".
"""

from analysis import analyse, arguments, catalogue, cli, inputs


def parse_args(argv):
  """The command line (analysis/arguments.py: parsed there before this module's imports when run
  as `python -m analysis.draw`)."""
  return arguments.draw(argv)


def figures(out, hist, folder, steps=None):
  """Every figure of the study's analysis `out` (analysis.numbers.result.Analysis) that its data
  allow, into `folder`; returns the paths. `hist`: its runs' histories; `steps`: their per-step
  table (analysis.inputs.results.load_steps'; None: read from the analysed runs' folders)."""
  if steps is None:
    steps = inputs.steps_frame(out.runs['run'])
  given = catalogue.Given(result=out, attribution=out.attribution, histories=hist, steps=steps)
  return catalogue.write(catalogue.DRAW, given, folder)


def main(argv=None):
  args = parse_args(argv)
  with cli.destination(args.out) as dest:  # locked, drawn at once (analysis/output.py)
    runs, hist, declared = inputs.load_study(args.runs, args.study)
    out = analyse.study_analysis(
      runs,
      declared,
      args.group_by,
      args.metric,
      args.margin,
      args.margin_reason,
      read_predictions=inputs.read_predictions,
    )
    written = dest.write(lambda folder: figures(out, hist, folder))
  for path in written:
    print(path)


if __name__ == '__main__':
  main()
