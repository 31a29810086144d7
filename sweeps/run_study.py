"""A whole study in one command: `python -m sweeps.sweep` (it resumes), then `python -m
analysis.analyse` of ROOT's runs and the --runs roots' into ROOT. Exit code 1 if a run failed."""

import os
import sys
import time

from analysis import analyse as cli
from runrecord import record
from sweeps import sweep
from trainer import metrics


def main(argv=None):
  p = cli.Parser(
    prog='python -m sweeps.run_study',
    description='The sweep, then its analysis (the report, the attribution, the figures).',
  )
  sweep.add_run_args(p, 'configs/digits.py:study', 'local folder for the runs, report, figures/')
  p.add_argument('--group-by', nargs='+', default=[], help='columns making an arm (as analyse)')
  p.add_argument('--metric', default=record.DEFAULT_METRIC, help='compared (as analysis.analyse)')
  p.add_argument('--margin', help="equivalence margin, pp (default: the config's get_study())")
  p.add_argument('--margin-reason', help='why --margin (printed in the report)')
  p.add_argument('--runs', nargs='+', default=[], metavar='ROOT', help='more roots to analyse')
  p.add_argument('--all-pairs', action='store_true', help='also test every pair of arms')
  args = p.parse_args(argv)
  missing = [r for r in args.runs if '://' not in r and not os.path.isdir(r)]
  problem = f'--runs: {missing[0]} is not a folder; give roots that hold runs' if missing else ''
  if '://' in args.root:
    problem = f'--root={args.root}: a study runs locally; for bucket roots use python -m '
    problem += 'sweeps.sweep --dry-run, then python -m analysis.analyse --runs='
  if problem:  # bad input: one line, before the sweep starts
    print(f'error: {problem}', file=sys.stderr)
    return 2
  start, root = time.time(), os.path.abspath(args.root)
  devices = [f'--gpus={args.gpus}'] if args.gpus else []
  devices += [f'--tpu-chips={args.tpu_chips}'] if args.tpu_chips is not None else []
  parallel = [f'--parallel={args.parallel}'] if args.parallel else []
  code = sweep.main([f'--config={args.config}', f'--root={args.root}', *parallel, *devices])
  if code == 2 or code >= 128:  # bad input found before any run, or stopped by a signal
    return code
  print(f'\nreport (also in {os.path.join(root, "report.md")}):\n', flush=True)
  from analysis import analyse

  argv = ['--runs', root, *args.runs, '--out', root, '--metric', args.metric]
  argv += ['--group-by', *args.group_by] if args.group_by else []
  argv += ['--all-pairs'] if args.all_pairs else []
  for flag, value in (('--margin', args.margin), ('--margin-reason', args.margin_reason)):
    argv += [flag, value] if value is not None else []
  analyse.main(argv)  # bad input: one line, exit 2
  load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
  print(
    f'study finished in {metrics.duration(time.time() - start)} (load average {load})'
    + ('; some runs failed: see above' if code else '')
  )
  return code


if __name__ == '__main__':
  sys.exit(main())
