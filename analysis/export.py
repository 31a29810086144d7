"""Export runs as a compact CSV: one row per run, the record's columns (analysis.inputs.results'
runs table: status, seed, platform, device kind, final metrics, requested and effective numerics,
config, data facts, versions), without the per-epoch history, the training state or the columns
no run fills; `run` is the run's path relative to the roots' common parent folder.

  python -m analysis.export --runs /data/h100 /data/cpu --out results/digits_h100_cpu.csv \
      --study configs/digits.py:study

`--study` also writes the study's declaration beside the CSV (FILE.study.json), so that
`python -m analysis.analyse --csv FILE.csv --study FILE.study.json` tests what the study declared.
Both are written beside the CSV first and moved into place together, under a lock on the CSV
(analysis/output.py): a failed export leaves the previous one whole. Each row carries its run's
`run_id` (runrecord/record.py run_identity), so the same run met in two exports is one run.
The CSV reads back (analysis.inputs.csv_input.read_csv) to the same tables as the runs it came from.
Reference: docs/statistics.md "Commands".
"""

import os

from analysis import arguments, cli, declaration, inputs


def relative_runs(runs, roots):
  """The run paths relative to the roots' common parent folder (the roots' own names kept)."""
  parents = [r.rstrip('/').split('/')[:-1] for r in inputs.as_roots(roots)]
  common = []
  for parts in zip(*parents, strict=False):
    if len(set(parts)) > 1:
      break
    common.append(parts[0])
  prefix = '/'.join(common) + '/'
  return [r[len(prefix) :] if r.startswith(prefix) else r for r in runs]


def export(roots):
  """The runs table of the roots as exported: empty columns dropped, runs relative."""
  frame = inputs.load_runs(roots, checked=False)  # a copy of the table as it is
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


def write(frame, declared, folder, name):
  """FOLDER/NAME (the CSV) and, with a declaration, its FILE.study.json; their paths."""
  paths = [os.path.join(folder, name)]
  frame.to_csv(paths[0], index=False, encoding='utf-8')
  if declared:
    paths.append(study_path(paths[0]))
    with open(paths[1], 'w', encoding='utf-8') as f:
      f.write(declaration.dumps(declared))
  return paths


def main(argv=None):
  cli.locale_proof()
  args = parse_args(argv)
  if not args.out.endswith('.csv') or os.path.isdir(args.out):
    cli.fail(f'--out={args.out}: give a .csv file name')
  with cli.destination(args.out, folder=False) as dest:  # locked, written at once (output.py)
    declared = declaration.load(args.study) if args.study else None
    frame = export(args.runs)
    written = dest.write(lambda folder: write(frame, declared, folder, os.path.basename(args.out)))
  print(f'wrote {written[0]}: {len(frame)} runs, {frame.shape[1]} columns')
  for path in written[1:]:
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
