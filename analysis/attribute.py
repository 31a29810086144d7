"""Which numerical setting explains a difference in a metric, as a command: analysis.numbers.
attribution's factor effects and platform gap decomposition, printed in words and written as
tables and figures.

  python -m analysis.attribute --runs=/tmp/study --factors platform profile --margin 0.3 \
      --noise-arm profile=noise --out /tmp/study
  python -m analysis.attribute --csv=published.csv --factors platform compute_dtype --metric acc

With --out DIR: attribution.csv (exact columns), attribution.md, and with a platform gap
attribution_gap.csv and attribution_decomposition.csv (one row per platform pair, --compare A:B ...;
default every pair, tpu − gpu first); the forest plot and the gap figure
(analysis/figures/forest.py), written at once under a lock on --out (analysis/output.py). Bad
input: one `error: ...` line, exit code 2, nothing written.
"""

import os

from analysis import arguments, cli
from analysis.figures import forest
from analysis.inputs import csv_input, declaration, results
from analysis.numbers import attribution, effects, gap_verdict
from analysis.words import attribution_text


def write_tables(out, out_dir):
  """attribution.csv (exact columns), attribution.md, and with a gap attribution_gap.csv (every
  component) and attribution_decomposition.csv (one row per gap: verdict, share, seeds)."""
  os.makedirs(out_dir, exist_ok=True)
  files = [os.path.join(out_dir, 'attribution.csv'), os.path.join(out_dir, 'attribution.md')]
  out.terms[effects.CSV_COLUMNS].to_csv(files[0], index=False)
  with open(files[1], 'w', encoding='utf-8') as f:
    f.write(attribution_text.render(out))
  if out.gap is not None:
    files += [os.path.join(out_dir, f'attribution_{n}.csv') for n in ('gap', 'decomposition')]
    out.gap.to_csv(files[-2], index=False)
    gap_verdict.flat(out.decomposition).to_csv(files[-1], index=False)
  return files


def write(out, out_dir):
  """write_tables, the forest plot and, with a gap, the gap figure (analysis/forest.py)."""
  return (write_tables(out, out_dir) + forest.plot(out, out_dir)
          + (forest.plot_gap(out, out_dir) or []))


def parse_args(argv):
  """The command line (analysis/arguments.py: parsed there before this module's imports when run
  as `python -m analysis.attribute`)."""
  return arguments.attribute(argv)


def named_columns(args):
  """The columns the command line names (factors, and those of the arms): read from a CSV."""
  arms = args.reference + args.noise_arm + args.native + args.platform_profile
  return args.factors + [str(a).split('=')[0] for a in arms]


def main(argv=None):
  cli.locale_proof()
  args = parse_args(argv)
  try:
    cli.check_out_folder(args.out)
  except ValueError as e:
    cli.fail(e)
  with cli.destination(args.out) as dest:  # locked, written at once (analysis/output.py)
    frame = (results.load_runs(args.runs) if args.runs else
             csv_input.read_csv(args.csv, args.metric, args.seed_col, named_columns(args), True))
    out = attribution.factor_attribution(frame, args.factors, args.metric, args.seed_col, args.reference,
                          args.interactions, args.margin, args.noise_arm, args.native,
                          args.platform_profile, ' '.join(args.runs or [args.csv]),
                          noise_of=args.noise_of, min_share=args.min_share,
                          compare=declaration.parse_compare(args.compare), compare_flag='--compare')
    print(attribution_text.render(out))
    written = dest.write(lambda folder: write(out, folder)) if dest else []
  for path in written:
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
