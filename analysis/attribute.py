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
Reference: docs/statistics.md "Commands".
"""

from analysis import arguments, attribution, catalogue, cli, declaration, inputs, report


def given(att, result=None):
  """What the writers of analysis/catalogue.py read from the attribution `att` (and the study's
  analysis `result`, analysis.analyse's): the attribution, its text and its CSV tables (the
  terms' exact columns; one row per platform pair's decomposition, where there is one)."""
  flat = attribution.flat(att.decomposition) if att.decomposition else None
  return catalogue.Given(
    result=result,
    attribution=att,
    attribution_md=report.attribution_report(att),
    attribution_terms=att.terms[attribution.CSV_COLUMNS],
    decomposition=flat,
  )


def write(att, out_dir, only=None):
  """Every file and figure analysis/catalogue.py lists for analysis.attribute (`only`: those
  names), into out_dir; returns their paths."""
  return catalogue.write(catalogue.ATTRIBUTE, given(att), out_dir, only)


def write_tables(att, out_dir):
  """write's tables without its figures."""
  return write(att, out_dir, only={f.name for f in catalogue.files(catalogue.ATTRIBUTE)})


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
    frame = (
      inputs.load_runs(args.runs)
      if args.runs
      else inputs.read_csv(args.csv, args.metric, args.seed_col, named_columns(args), True)
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
    )
    print(report.attribution_report(out))
    written = dest.write(lambda folder: write(out, folder)) if dest else []
  for path in written:
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
