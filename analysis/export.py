"""Export runs as a compact CSV, one row per run (docs/statistics.md "Commands"); --study writes the
declaration beside it as FILE.study.json, and an export without it removes the one it wrote.

  python -m analysis.export --runs /data/h100 /data/cpu --out results/digits_h100_cpu.csv
"""

import os

from analysis import analyse, declaration

COMMAND = 'analysis.export'


def parse_args(argv):
  p = analyse.Parser(
    prog='python -m analysis.export',
    description='Export runs as a compact CSV: one row per run, the columns of its '
    'results record (status, seed, platform, device kind, final metrics, requested '
    'and effective numerics, config, data facts, versions), without the per-epoch '
    'history, the training state or the columns no run fills.',
  )
  analyse.add_runs_argument(p, required=True)
  p.add_argument('--out', required=True, help='the CSV file to write')
  p.add_argument(
    '--study',
    default=None,
    help="also write the study's declaration (a config file with get_study(), or a "
    'study.json) beside the CSV as FILE.study.json',
  )
  return p.parse_args(argv)


def export(roots):
  """The runs table of the roots as exported: empty columns dropped, runs relative."""
  from analysis import inputs

  frame = inputs.load_runs(roots, checked=False)  # a copy of the table as it is
  frame = frame.dropna(axis=1, how='all')
  parents = [r.rstrip('/').split('/')[:-1] for r in inputs.as_roots(roots)]
  prefix = '/'.join(os.path.commonprefix(parents)) + '/'
  frame['run'] = [r[len(prefix) :] if r.startswith(prefix) else r for r in frame['run']]
  return frame


def study_path(csv_path):
  """Where the declaration goes beside a CSV: FILE.csv -> FILE.study.json."""
  stem = csv_path[:-4] if csv_path.endswith('.csv') else csv_path
  return f'{stem}.study.json'


def main(argv=None):
  analyse.locale_proof()
  args = parse_args(argv)
  if not args.out.endswith('.csv') or os.path.isdir(args.out):
    analyse.fail(f'--out={args.out}: give a .csv file name')
  companion = os.path.basename(study_path(os.path.realpath(args.out)))
  may_write = [companion] if args.study else []  # a user's FILE.study.json in the way: refused
  kwargs = {'folder': False, 'companions': [companion]}
  with analyse.destination(args.out, COMMAND, may_write, **kwargs) as dest:
    declared = declaration.load(args.study) if args.study else None
    frame = export(args.runs)

    def write(folder):
      paths = [os.path.join(folder, os.path.basename(os.path.realpath(args.out)))]
      frame.to_csv(paths[0], index=False, encoding='utf-8')
      if declared:
        paths.append(analyse.write_text(folder, companion, declaration.dumps(declared)))
      return paths

    written = dest.write(write)
  print(f'wrote {written[0]}: {len(frame)} runs, {frame.shape[1]} columns')
  for path in written[1:]:
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
