"""Which numerical setting explains a difference, as a command: the factor effects and each
platform pair's gap decomposition, printed and written as tables and figures.

  python -m analysis.attribute --csv published.csv --factors platform compute_dtype --out DIR
"""

from analysis import analyse, declaration
from runrecord import record

COMMAND = 'analysis.attribute'
FILES = (
  'attribution.csv',
  'attribution.md',
  'attribution_gap.csv',
  'attribution_decomposition.csv',
)
FIGURES = ('gap_decomposition', 'attribution_forest')


def parse_args(argv):
  p = analyse.Parser(
    prog='python -m analysis.attribute',
    description='Which numerical setting explains a difference in a metric, as a '
    "command: analysis.attribution's factor effects and platform gap "
    'decomposition, printed in words and written as tables and figures.',
  )
  src = p.add_mutually_exclusive_group(required=True)
  analyse.add_runs_argument(src)
  src.add_argument('--csv', help='a CSV of results, one row per run')
  p.add_argument(
    '--metric',
    default=record.DEFAULT_METRIC,
    help=f'the column whose differences are attributed (default '
    f'{record.DEFAULT_METRIC}; accuracies in [0, 1] are reported in percent)',
  )
  p.add_argument('--factors', nargs='+', required=True, help='factor columns (platform included)')
  p.add_argument(
    '--seed-col',
    default='seed',
    help="column holding each run's seed: runs of one seed are paired and the seed "
    "is a random effect (default 'seed')",
  )
  p.add_argument('--reference', nargs='+', default=[], help='factor=level: reference levels')
  p.add_argument('--interactions', nargs='+', default=[], help='A:B interactions to add')
  p.add_argument(
    '--margin',
    type=analyse.margin_flag,
    default=None,
    help='equivalence margin (pp for accuracies)',
  )
  p.add_argument('--noise-arm', nargs='+', default=[], help='factor=level: the noise-control arm')
  p.add_argument(
    '--noise-of',
    nargs='+',
    default=[],
    help='factor=level: the arm the noise arm perturbs (default: the reference arm)',
  )
  p.add_argument(
    '--min-share',
    type=analyse.share_flag,
    default=None,
    help='share of the gap the numerics part must reach (lower 95%% bound) for '
    f'"explained by numerics" (default {declaration.MIN_SHARE:g})',
  )
  p.add_argument('--native', nargs='+', default=[], help='factor=level of the native arm')
  p.add_argument(
    '--platform-profile',
    nargs='+',
    default=[],
    help='platform=level: the profile emulating each platform, e.g. gpu=jax_gpu_default',
  )
  analyse.add_compare_argument(p)
  p.add_argument(
    '--device-kinds',
    choices=('split', 'blocked'),
    default='split',
    help="a platform's runs on several device kinds: each kind a platform (split) or one "
    'platform with the kind as a blocking factor, its effect stated (blocked)',
  )
  p.add_argument(
    '--out', help=f'folder for {", ".join(FILES)}; {", ".join(FIGURES)} (.pdf and .png)'
  )
  return p.parse_args(argv)


def write(att, folder):
  """The attribution's files and figures into `folder`; the paths."""
  from analysis import attribution, figures, report

  paths = analyse.write_csv(attribution.tables(att), folder)
  paths.append(analyse.write_text(folder, 'attribution.md', report.attribution_report(att)))
  return paths + figures.attribution_figures(att, folder)


def may_write():
  return list(FILES) + [f'{n}.{e}' for n in FIGURES for e in ('pdf', 'png')]


def main(argv=None):
  analyse.locale_proof()
  args = parse_args(argv)
  with analyse.destination(args.out, COMMAND, may_write()) as dest:  # refused before any compute
    from analysis import attribution, inputs, report

    arms = args.reference + args.noise_arm + args.native + args.platform_profile
    named = args.factors + [str(a).split('=')[0] for a in arms]  # read from a CSV as named
    frame = inputs.split_device_kinds(
      inputs.load_runs(args.runs)
      if args.runs
      else inputs.read_csv(args.csv, args.metric, args.seed_col, named, True)
    )
    out = attribution.factor_attribution(
      frame,
      args.factors,
      args.metric,
      args.seed_col,
      args.reference,
      args.interactions,
      args.margin,
      args.noise_arm,
      args.native,
      args.platform_profile,
      ' '.join(args.runs or [args.csv]),
      noise_of=args.noise_of,
      min_share=args.min_share,
      compare=declaration.parse_compare(args.compare),
      compare_flag='--compare',
      device_kinds=args.device_kinds,
    )
    print(report.attribution_report(out))
    written = dest.write(lambda folder: write(out, folder)) if dest else []
  for path in written:
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
