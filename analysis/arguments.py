"""The command lines of the analysis commands (analyse, attribute, draw, export, findings), kept
apart from them so that they import nothing heavy: argparse, analysis/cli.py and the light
analysis/inputs/declaration.py and runrecord/record.py (no pandas, statsmodels or matplotlib).

`python -m analysis.<command>` runs analysis/__init__.py before the command's own module, with
sys.argv[0] == '-m' while the module is being found: there `early` parses the command's flags, so
--help and a bad flag are answered in a fraction of a second, before the command imports the
statistics and plotting libraries. Each command's `parse_args` is the same parser (one owner).
Reference: docs/statistics.md "Commands".
"""

import sys

from analysis import catalogue, cli, declaration
from runrecord import record

RUNS_HELP = 'one or more roots holding the runs (local or gs://, mixed)'


def add_runs_argument(parser, required=False):
  """The --runs ROOT [ROOT ...] flag every reader takes (a parser or a mutually exclusive group)."""
  parser.add_argument('--runs', nargs='+', required=required, metavar='ROOT', help=RUNS_HELP)


def add_study_argument(parser):
  """The --study flag of the commands that read a declaration."""
  parser.add_argument(
    '--study',
    default=None,
    help="the study's declaration: a study.json, or a config file with "
    'get_study() (default: the study.json in the roots)',
  )


def add_compare_argument(parser):
  """The --compare flag of the commands that decompose a platform gap."""
  parser.add_argument(
    '--compare',
    nargs='+',
    default=None,
    metavar='A:B',
    help='platform pairs whose gap A − B is decomposed, the first the question '
    '(default: the declared compare, else every pair, tpu before gpu before '
    'cpu); overriding the declared pairs makes the analysis exploratory',
  )


def analyse(argv):
  p = cli.Parser(
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
  cli.add_margin_argument(
    p, f'equivalence margin, pp (default: the declared one, else {declaration.DEFAULT_MARGIN:g})'
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
    type=cli.scale_flag,
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
    + catalogue.names(catalogue.ANALYSE),
  )
  return p.parse_args(argv)


def attribute(argv):
  p = cli.Parser(
    prog='python -m analysis.attribute',
    description='Which numerical setting explains a difference in a metric, as a '
    "command: analysis.numbers.attribution's factor effects and platform gap "
    'decomposition, printed in words and written as tables and figures.',
  )
  src = p.add_mutually_exclusive_group(required=True)
  add_runs_argument(src)
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
  cli.add_margin_argument(p, 'equivalence margin (pp for accuracies)')
  p.add_argument('--noise-arm', nargs='+', default=[], help='factor=level: the noise-control arm')
  p.add_argument(
    '--noise-of',
    nargs='+',
    default=[],
    help='factor=level: the arm the noise arm perturbs (default: the reference arm)',
  )
  p.add_argument(
    '--min-share',
    type=cli.share_flag,
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
  add_compare_argument(p)
  p.add_argument('--out', help='folder for ' + catalogue.names(catalogue.ATTRIBUTE))
  return p.parse_args(argv)


def draw(argv):
  p = cli.Parser(
    prog='python -m analysis.draw',
    description="The study's figures as a command (analysis/catalogue.py says what each shows).",
  )
  add_runs_argument(p, required=True)
  p.add_argument('--out', required=True, help='folder for ' + catalogue.names(catalogue.DRAW))
  add_study_argument(p)
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
    '--margin', type=float, default=None, help='equivalence margin, pp (default: the declared one)'
  )
  p.add_argument('--margin-reason', default=None, help='why this margin')
  return p.parse_args(argv)


def export(argv):
  p = cli.Parser(
    prog='python -m analysis.export',
    description='Export runs as a compact CSV: one row per run, the columns of its '
    'results record (status, seed, platform, device kind, final metrics, requested '
    'and effective numerics, config, data facts, versions), without the per-epoch '
    'history, the training state or the columns no run fills.',
  )
  add_runs_argument(p, required=True)
  p.add_argument('--out', required=True, help='the CSV file to write')
  p.add_argument(
    '--study',
    default=None,
    help="also write the study's declaration (a config file with get_study(), or a "
    'study.json) beside the CSV as FILE.study.json',
  )
  return p.parse_args(argv)


def findings(argv):
  p = cli.Parser(
    prog='python -m analysis.findings',
    description='The README\'s "What it finds on an H100 and a CPU", generated from '
    'the shipped export (results/): the platforms and their software, the gap '
    "decomposition at each margin, and the declared contrasts' verdicts.",
  )
  p.add_argument('--csv', required=True, help='the exported runs (analysis.export)')
  p.add_argument('--study', required=True, help="the study's declaration (FILE.study.json)")
  p.add_argument(
    '--margins',
    nargs='+',
    type=float,
    default=None,
    help='margins (pp) to judge at (default: the declared one)',
  )
  p.add_argument('--readme', default=None, help='replace the marked section of this file')
  return p.parse_args(argv)


COMMANDS = {
  'analyse': analyse,
  'attribute': attribute,
  'draw': draw,
  'export': export,
  'findings': findings,
}


def early(orig_argv=None):
  """From analysis/__init__.py: when this process is `python -m analysis.<command> ...` for a
  command above, and Python is still finding that module (sys.argv[0] is '-m' then), parse its
  flags now (--help prints and exits 0, a bad flag one line and exit 2); anything else: nothing."""
  if orig_argv is None and sys.argv[:1] != ['-m']:
    return
  argv = list(sys.orig_argv if orig_argv is None else orig_argv)
  if '-m' not in argv[:-1]:
    return
  module, rest = argv[argv.index('-m') + 1], argv[argv.index('-m') + 2 :]
  package, _, command = module.partition('.')
  if package == 'analysis' and command in COMMANDS:
    COMMANDS[command](rest)
    if sys.stderr.isatty():  # a person waiting (a log or a test wants bad input as one line)
      print(
        f'{module}: loading pandas, statsmodels and matplotlib (seconds; on a busy machine '
        'tens of seconds)',
        file=sys.stderr,
        flush=True,
      )
