"""The study's figures as a command, the figures analysis.analyse draws into figures/.

python -m analysis.draw --runs ROOT [ROOT ...] --out FIGURES [--study FILE] [--margin 0.5]
"""

from analysis import analyse
from runrecord import record

COMMAND = 'analysis.draw'


def parse_args(argv):
  p = analyse.Parser(
    prog='python -m analysis.draw',
    description="The study's figures as a command (docs/statistics.md says what each shows).",
  )
  analyse.add_runs_argument(p, required=True)
  p.add_argument(
    '--out', required=True, help=f'folder for {", ".join(analyse.FIGURES)} (.pdf and .png)'
  )
  analyse.add_study_argument(p)
  p.add_argument(
    '--group-by',
    nargs='+',
    default=[],
    help='columns defining an arm (default: platform, device kind, every requested '
    'numerics field and every config field that differs between the runs)',
  )
  p.add_argument(
    '--metric',
    default=record.DEFAULT_METRIC,
    help=f'the final metric per arm (default {record.DEFAULT_METRIC})',
  )
  p.add_argument(
    '--margin',
    type=analyse.margin_flag,
    default=None,
    help='equivalence margin, pp (default: the declared one)',
  )
  p.add_argument('--margin-reason', default=None, help='why this margin')
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  may_write = [f'{n}.{e}' for n in analyse.FIGURES for e in ('pdf', 'png')]
  with analyse.destination(args.out, COMMAND, may_write) as dest:  # refused before any compute
    from analysis import figures, inputs

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
    steps = inputs.steps_frame(out.runs['run'])
    written = dest.write(lambda folder: figures.study_figures(out, hist, steps, folder))
  for path in written:
    print(path)


if __name__ == '__main__':
  main()
