"""A whole study in one command: the sweep, then its analysis (the report, the attribution, the
figures).

  python -m sweeps.run_study --config=configs/digits.py:study --root=/tmp/study --parallel 2
  python -m sweeps.run_study --config=configs/digits.py:study --root=runs/cpu --runs gs://b/gpu

Runs `python -m sweeps.sweep` (finished runs are skipped, so the command resumes), then
`python -m analysis.analyse` on the root's runs and those of the roots given with --runs, writing
ROOT/report.md, report.tex, report_<table>.csv, attribution*.{md,csv} and ROOT/figures. Failed
runs are excluded and listed; the exit code is then 1. See docs/operations.md ("Sweeps and
studies") and docs/statistics.md.
"""

import os
import sys
import time

from analysis import cli
from runrecord import record
from sweeps import sweep, sweep_args
from trainer import writers

# The analysis (pandas, statsmodels, matplotlib) is imported where it runs: --help and a bad flag
# are answered before it loads.


def parse_args(argv):
  p = cli.Parser(
    prog='python -m sweeps.run_study',
    description='A whole study in one command: the sweep, then its analysis (the '
    'report, the attribution, the figures).',
  )
  sweep_args.add_run_args(
    p, 'configs/digits.py:study', 'local folder for the runs, the report and figures/'
  )
  p.add_argument(
    '--group-by',
    nargs='+',
    default=[],
    help='columns defining an arm (as analysis.analyse --group-by; default: platform, '
    'device kind and every numerics and config field that differs between runs)',
  )
  p.add_argument(
    '--metric',
    default=record.DEFAULT_METRIC,
    help=f'the column compared between arms (default {record.DEFAULT_METRIC})',
  )
  p.add_argument(
    '--margin',
    type=float,
    default=None,
    help="equivalence margin, pp (default: the config's get_study() declaration)",
  )
  p.add_argument('--margin-reason', default=None, help='why --margin (printed in the report)')
  p.add_argument(
    '--runs',
    nargs='+',
    default=[],
    metavar='ROOT',
    help='more roots whose runs are analysed with this one (local or gs://), e.g. the '
    'same study on another platform',
  )
  p.add_argument('--all-pairs', action='store_true', help='also test every pair of arms')
  return p.parse_args(argv)


def sweep_argv(args):
  argv = [f'--config={args.config}', f'--root={args.root}']
  if args.parallel:
    argv.append(f'--parallel={args.parallel}')
  if args.gpus:
    argv.append(f'--gpus={args.gpus}')
  if args.tpu_chips:
    argv.append(f'--tpu-chips={args.tpu_chips}')
  return argv


def analyse_roots(
  root, group_by, metric, margin=None, config=None, margin_reason=None, more=(), all_pairs=False
):
  """The analysis of the runs under `root` and the `more` roots: print the report, write it, the
  attribution and figures/ into root (analysis.analyse). The declaration is the roots' study.json,
  else the config's get_study()."""
  from analysis import analyse
  from analysis.inputs import results, run_predictions
  from analysis.numbers import answer

  roots = [root, *more]
  frame, hist, declared = results.load_study(roots, config=config)
  out = answer.study_analysis(
    frame,
    declared,
    group_by,
    metric,
    margin,
    margin_reason,
    all_pairs=all_pairs,
    source=' '.join(roots),
    read_predictions=run_predictions.read_runs,
  )
  return analyse.publish(out, hist, 'md', root)


def main(argv=None):
  args = parse_args(argv)
  if '://' in args.root:
    print(
      f'error: --root={args.root}: a study runs locally; for bucket roots use '
      'python -m sweeps.sweep --dry-run, then python -m analysis.analyse --runs=',
      file=sys.stderr,
    )
    return 2
  missing = [r for r in args.runs if '://' not in r and not os.path.isdir(r)]
  if missing:
    print(
      f'error: --runs: {missing[0]} is not a folder; give roots that hold runs (checked before '
      'the sweep starts)',
      file=sys.stderr,
    )
    return 2
  start = time.time()
  code = sweep.main(sweep_argv(args))
  if code == 2 or code >= 128:  # bad input found before any run, or stopped by a signal
    return code
  print(
    f'\nreport (also in {os.path.join(os.path.abspath(args.root), "report.md")}):\n', flush=True
  )
  try:
    written = analyse_roots(
      os.path.abspath(args.root),
      args.group_by,
      args.metric,
      args.margin,
      args.config,
      args.margin_reason,
      args.runs,
      args.all_pairs,
    )
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print('\nwritten:\n' + '\n'.join(f'  {p}' for p in written))
  load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
  print(
    f'study finished in {writers.duration(time.time() - start)} (load average {load})'
    + ('; some runs failed: see above' if code else '')
  )
  return code


if __name__ == '__main__':
  sys.exit(main())
