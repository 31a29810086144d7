"""Export runs as a compact CSV: one row per run, the record's columns (analysis.inputs.results'
runs table: status, seed, platform, device kind, final metrics, requested and effective numerics,
config, data facts, versions), without the per-epoch history, the training state or the columns
no run fills; `run` is the run's path relative to the roots' common parent folder.

  python -m analysis.export --runs /data/h100 /data/cpu --out results/digits_h100_cpu.csv \
      --study configs/digits.py:study

`--study` also writes the study's declaration beside the CSV (FILE.study.json), so that
`python -m analysis.analyse --csv FILE.csv --study FILE.study.json` tests what the study declared.
The CSV reads back (analysis.numbers.stats.read_csv) to the same tables as the runs it came from.
"""

import os

from analysis import arguments, cli
from analysis.inputs import declaration, results


def relative_runs(runs, roots):
  """The run paths relative to the roots' common parent folder (the roots' own names kept)."""
  parents = [r.rstrip('/').split('/')[:-1] for r in results.as_roots(roots)]
  common = []
  for parts in zip(*parents):
    if len(set(parts)) > 1:
      break
    common.append(parts[0])
  prefix = '/'.join(common) + '/'
  return [r[len(prefix):] if r.startswith(prefix) else r for r in runs]


def export(roots):
  """The runs table of the roots as exported: empty columns dropped, runs relative."""
  frame = results.load_runs(roots)
  frame = frame.dropna(axis=1, how='all')
  frame['run'] = relative_runs(frame['run'], roots)
  return frame


def study_path(csv_path):
  """Where the declaration goes beside a CSV: FILE.csv -> FILE.study.json."""
  stem = csv_path[:-4] if csv_path.endswith('.csv') else csv_path
  return f'{stem}.study.json'


def parse_args(argv):
  """The command line (analysis/arguments.py: parsed there before this module's imports when run
  as `python -m analysis.export`)."""
  return arguments.export(argv)


def main(argv=None):
  cli.locale_proof()
  args = parse_args(argv)
  try:
    if not args.out.endswith('.csv'):
      raise ValueError(f'--out={args.out}: give a .csv file name')
    declared = declaration.load(args.study) if args.study else None
    frame = export(args.runs)
  except ValueError as e:
    cli.fail(e)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  frame.to_csv(args.out, index=False, encoding='utf-8')
  print(f'wrote {args.out}: {len(frame)} runs, {frame.shape[1]} columns')
  if declared:
    path = study_path(args.out)
    with open(path, 'w', encoding='utf-8') as f:
      f.write(declaration.dumps(declared))
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
