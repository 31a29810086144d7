"""A study's whole analysis in one command: the report (the answer first), its tables, the
attribution and the figures, from one or more roots of runs (local and gs://, mixed) or a CSV.

  python -m analysis.analyse --runs runs/study --out runs/study   # what sweeps.run_study runs
  python -m analysis.analyse --runs gs://bucket/gpu runs/cpu --out out   # two platforms' roots
  python -m analysis.analyse --csv results/digits_h100_cpu.csv \
    --study results/digits_h100_cpu.study.json
  python -m analysis.analyse --csv published.csv --group-by platform --metric accuracy

The tests are the study's declared contrasts (the root's study.json, or --study; every pair of arms
with --all-pairs or without a declaration). Without --out the report is printed (--format md,
latex: its booktabs tables, csv: its tables); with --out DIR it is printed and every file and
figure analysis/catalogue.py lists for this command is written into DIR (figures into DIR/figures),
at once and under a lock (analysis/output.py). What each file holds: docs/statistics.md "Report
and figures"; bad input and failed writes: docs/statistics.md and analysis/cli.py.
"""

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import pandas as pd

from analysis import (
  agreement,
  arguments,
  attribute,
  attribution,
  catalogue,
  cli,
  declaration,
  inputs,
  output,
  report,
  stats,
)
from analysis.agreement import Agreement
from analysis.attribution import Attribution
from runrecord import record, rules


class Platform(NamedTuple):
  """A platform's recorded device kind, device count, package versions and CPU facts (each the
  distinct values as text: inputs.distinct)."""

  device_kind: Optional[str]
  devices: Optional[str]
  versions: dict[str, Optional[str]]
  cpu: dict[str, Optional[str]]


@dataclasses.dataclass(frozen=True)
class Software:
  """Each platform's `platforms` facts, and the packages whose versions differ between them."""

  platforms: dict[str, Platform] = dataclasses.field(default_factory=dict)
  confounds: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Scope:
  """Confirmatory (True: the declared seeds at the declared margin and pairs), exploratory (False)
  or nothing declared (None), with the `deviations` from the declaration in words."""

  declared_seeds: Optional[list[int]]
  declared_margin: Optional[float]
  analysed_seeds: list[int]
  margin: float
  deviations: list[str]
  declared_seeds_present: bool
  confirmatory: Optional[bool]


@dataclasses.dataclass(frozen=True)
class Analysis(stats.Stats):
  """A study's whole analysis: stats.Stats plus its `declared` declaration and `source`, the
  declared `contrasts` and `arm_info` (stats.arm_levels; None undeclared), `noise` floors,
  `attribution`, `software`, `agreement`, `scope`, and for an exploratory analysis the
  `confirmatory` one (the declared seeds at the declared margin)."""

  declared: dict[str, Any] = dataclasses.field(default_factory=dict)
  source: str = ''
  contrasts: Optional[pd.DataFrame] = None
  arm_info: Optional[pd.DataFrame] = None
  noise: dict[str, stats.NoiseFloor] = dataclasses.field(default_factory=dict)
  attribution: Optional[Attribution] = None
  software: Software = dataclasses.field(default_factory=Software)
  agreement: Optional[Agreement] = None
  scope: Optional[Scope] = None
  confirmatory: Optional['Analysis'] = None


def platform_profile(runs, declared):
  """The declared {platform: profile} of the platforms run ('cpu-AVX2' takes cpu's)."""
  present = set(runs['platform'].astype(str)) if 'platform' in runs else set()
  given = attribution.parse_pairs(declared or {}, '--platform-profile')
  return {
    p: given.get(p, given.get(rules.jax_platform(p)))
    for p in sorted(present)
    if p in given or rules.jax_platform(p) in given
  }


def software(runs):
  """The Software of the analysed runs."""
  if 'platform' not in runs:
    return Software()
  prefix = 'versions.'
  packages = sorted(c[len(prefix) :] for c in runs if c.startswith(prefix))
  out = {}
  for platform, group in runs.groupby(runs['platform'].astype(str), sort=True):
    out[platform] = Platform(
      device_kind=inputs.distinct(group.get('device_kind', pd.Series(dtype=str))),
      devices=inputs.distinct(group.get('num_devices', pd.Series(dtype=str))),
      versions={p: inputs.distinct(group[prefix + p]) for p in packages},
      cpu={f: inputs.distinct(group[f]) if f in group else None for f in record.CPU_FACTS},
    )
  confounds = [
    p for p in packages if len({v.versions[p] for v in out.values() if v.versions[p]}) > 1
  ]
  return Software(platforms=out, confounds=confounds)


def term_labels(terms, declared):
  """{term: short label}: 'profile=tpu_default' -> 'tpu_default', 'platform=gpu' -> 'platform
  gpu'."""
  out = {}
  for term in terms:
    factor, _, level = term.partition('=')
    out[term] = (
      f'platform {level}'
      if factor == 'platform'
      else declaration.factor_label(declared, factor, level)
      if level and ':' not in term
      else term
    )
  return out


def declared_attribution(
  frame, declared, metric, seed_col, margin, margin_reason, source, compare=None
):
  """The attribution with the declared factors, arms and platform pairs (`compare`: --compare's)."""
  completed = frame[stats.run_status(frame) == 'completed']
  out = attribution.factor_attribution(
    frame,
    declared.get('factors') or attribution.default_factors(frame),
    metric=metric,
    seed_col=seed_col or 'seed',
    reference=declared.get('reference'),
    margin=margin,
    noise_arm=declared.get('noise_arm'),
    noise_of=declared.get('noise_of'),
    min_share=declared.get('min_share'),
    native=declared.get('native'),
    platform_profile=platform_profile(completed, declared.get('platform_profile')),
    source=source,
    margin_reason=margin_reason,
    compare=compare or declared.get('compare'),
    compare_flag='--compare' if compare else 'compare',
  )
  return dataclasses.replace(out, labels=term_labels(out.terms['term'], declared))


def study_analysis(
  frame: pd.DataFrame,
  declared: Optional[dict[str, Any]] = None,
  group_by: Sequence[str] = (),
  metric: str = stats.DEFAULT_METRIC,
  margin: Optional[float] = None,
  margin_reason: Optional[str] = None,
  seed_col: Optional[str] = None,
  scale: Optional[float] = None,
  all_pairs: bool = False,
  source: str = '',
  read_predictions: Optional[Callable[[pd.DataFrame], list[inputs.Read]]] = None,
  compare: Optional[Sequence[Sequence[str]]] = None,
) -> Analysis:
  """The whole analysis of a study's runs table (inputs.load_study's or inputs.read_csv's): every
  number its report, tables and figures show.

  `declared`: its declaration ({} or None: every pair of arms is compared, no attribution);
  `group_by`, `metric`, `seed_col`, `scale`: stats.prepare's; `margin`, `margin_reason`: None, the
  declared ones; `all_pairs`: also every pair; `source`: what the runs were read from;
  `read_predictions`: runs -> [(predictions or None, why)] (inputs.read_predictions; None: a CSV);
  `compare`: --compare's platform pairs (an exploratory analysis). Bad input: a ValueError of one
  line naming the flag or field.
  """
  declared = declared or {}
  margin, why = stats.margin_choice(
    margin, margin_reason, declared.get('margin'), declared.get('margin_reason')
  )
  declares = bool(declared.get('factors') and declared.get('reference'))
  if compare:
    check_compare(frame, compare, declares)
  numbers = stats.arms_and_pairs(
    frame, group_by, metric, margin, why, seed_col, scale, all_pairs=all_pairs or not declares
  )
  out = Analysis(
    **stats.fields_of(numbers), declared=declared, source=source, software=software(numbers.runs)
  )
  if declares:
    out = dataclasses.replace(out, arm_info=stats.arm_levels(out, declared))
    out = dataclasses.replace(
      out,
      contrasts=stats.contrast_table(out, declared),
      noise=stats.noise_floors(
        out.runs,
        declared.get('noise_arm') or {},
        declared.get('noise_of') or declared.get('reference') or {},
        out.unit,
        list(stats.factor_columns(out.runs, declared).values()),
      ),
      attribution=declared_attribution(
        frame, declared, out.metric, seed_col, margin, why, source, compare
      ),
    )
  # The run folders' saved predictions, read by `read_predictions`; a CSV's rows have none.
  labels = stats.arm_short_labels(out)
  out = dataclasses.replace(
    out, agreement=agreement.from_analysis(out, labels, read=read_predictions)
  )
  sc = scope(out, declared, compare)
  out = dataclasses.replace(out, scope=sc)
  if sc.confirmatory is False and sc.declared_seeds_present:
    seeds = pd.to_numeric(frame[seed_col or 'seed'], errors='coerce')
    confirmatory = study_analysis(
      frame[seeds.isin(sc.declared_seeds)],
      declared,
      group_by,
      metric,
      declared.get('margin'),
      None,
      seed_col,
      scale,
      all_pairs,
      source,
    )
    out = dataclasses.replace(out, confirmatory=confirmatory)
  return out


def check_compare(frame, compare, declares):
  """Refuse, before any statistic, --compare pairs naming a platform without completed runs, or a
  study without the declaration the gap decomposition needs."""
  if not declares:
    raise ValueError(
      '--compare: the platform gap is decomposed only for a declared study (factors, '
      "reference and native arm: the root's study.json, or --study)"
    )
  done = frame[stats.run_status(frame) == 'completed']
  present = sorted(set(done['platform'].astype(str))) if 'platform' in done else []
  attribution.platform_pairs(present, compare, '--compare')


def scope(out, declared, compare=None):
  """The Scope of `out`: confirmatory when exactly the declared seeds (0..k-1 for a count k) were
  analysed at the declared margin and platform pairs."""
  m0 = declared.get('margin')
  seeds = sorted({int(x) for x in out.runs['base_seed'].dropna()}) if out.seeded else []
  wanted = declaration.declared_seeds(declared)
  deviations = []
  if wanted is not None and seeds != sorted(wanted):
    deviations.append(
      f'{len(seeds)} seeds analysed, {len(wanted)} declared '
      f'(seeds {inputs.seed_text(pd.Series(wanted))})'
    )
  if m0 is not None and out.margin != m0:
    deviations.append(f'margin ±{out.margin:g}, declared ±{m0:g}')
  if compare:
    said = declaration.pairs_text(declared['compare']) if declared.get('compare') else 'every pair'
    deviations.append(
      f'platform pairs {declaration.pairs_text(compare)} from --compare (declared: {said})'
    )
  known = wanted is not None or m0 is not None or bool(compare)
  return Scope(
    declared_seeds=wanted,
    declared_margin=m0,
    analysed_seeds=seeds,
    margin=out.margin,
    deviations=deviations,
    declared_seeds_present=bool(wanted)
    and set(wanted) <= set(seeds)
    and (set(wanted) != set(seeds) or m0 is not None or bool(compare)),
    confirmatory=(not deviations) if known else None,
  )


COMMAND = catalogue.ANALYSE  # how its progress lines name it


def parse_args(argv):
  """The command line (analysis/arguments.py: parsed there before this module's imports when run
  as `python -m analysis.analyse`)."""
  return arguments.analyse(argv)


def named_columns(args, declared):
  """The columns the command line and the declaration name (--group-by, the declared factors and
  the factors of its reference, noise and native arms): read from a CSV whatever their kind."""
  names = list(args.group_by) + list(declared.get('factors') or [])
  for key in ('reference', 'noise_arm', 'native'):
    arm = declared.get(key) or {}
    names += list(arm) if isinstance(arm, dict) else [str(a).split('=')[0] for a in arm]
  return names


def load(args):
  """(runs table, histories, declaration, source) of the command line."""
  if args.runs:
    return (*inputs.load_study(args.runs, args.study), ' '.join(args.runs))
  declared = declaration.load(args.study) if args.study else {}
  frame = inputs.read_csv(
    args.csv, args.metric, args.seed_col, named_columns(args, declared), scale=args.scale
  )
  declaration.check_levels(declared, frame, args.study)
  return frame, frame.iloc[:0][['run']], declared, args.csv


def label_prefix(source):
  """The name the LaTeX labels of a study carry: its CSV's stem, or its roots' last folders
  ('digits_h100_cpu', 'h100-cpu'), in letters, digits and '-' only."""
  names = [os.path.splitext(os.path.basename(s.rstrip('/')))[0] for s in source.split()]
  return re.sub(r'[^A-Za-z0-9]+', '-', '-'.join(names)).strip('-') or 'study'


def render(out, fmt):
  """report.render, the LaTeX labels made the study's own (tab:NAME -> tab:PREFIX-NAME, label_prefix
  of the source): two studies' report.tex \\input into one paper repeat no \\label."""
  text = report.render(out, fmt)
  if fmt != 'latex':
    return text
  return text.replace(r'\label{tab:', rf'\label{{tab:{label_prefix(out.source)}-')


def given(out, hist, rendered=None):
  """What the writers of analysis/catalogue.py read from the analysis `out`: its result, the
  attribution's tables, the histories, the runs' steps (read from their folders) and the report
  in Markdown and LaTeX (`rendered`: {format: text} already rendered, not rendered again)."""
  rendered = rendered or {}

  def text(fmt):
    return rendered[fmt] if fmt in rendered else render(out, fmt)

  parts = attribute.given(out.attribution, out) if out.attribution else catalogue.Given(result=out)
  return dataclasses.replace(
    parts,
    histories=hist,
    steps=inputs.steps_frame(out.runs['run']),
    report_md=text('md'),
    report_tex=text('latex'),
  )


def write(out, hist, out_dir, rendered=None):
  """Every file and figure analysis/catalogue.py lists for analysis.analyse, into out_dir; returns
  their paths."""
  return catalogue.write(catalogue.ANALYSE, given(out, hist, rendered), out_dir)


def print_csv_tables(out):
  """`--format csv`: each CSV table of the report (catalogue.csv_tables), '# NAME' then its rows."""
  parts = attribute.given(out.attribution, out) if out.attribution else catalogue.Given(result=out)
  for name, table in catalogue.csv_tables(catalogue.ANALYSE, parts).items():
    sys.stdout.write(f'# {name}\n{table.to_csv(index=False)}\n')


def publish(out, hist, fmt='md', out_dir=None, dest=None):
  """Warn of arms with n < 2, print the report in `fmt` and, with out_dir, write every file into
  it (write), all at once and under its lock (analysis/output.py; `dest`: its Destination, already
  held); returns the paths written. output.Busy / output.WriteFailed (ValueErrors, one line) when
  another command holds out_dir or a write fails: the previous report is then whole."""
  for arm in out.small['arm']:
    print(
      f'warning: arm {arm!r} has n < 2 completed runs: reported, its tests skipped', file=sys.stderr
    )
  rendered = {}
  if fmt == 'csv':
    print_csv_tables(out)
  else:
    rendered[fmt] = render(out, fmt)
    sys.stdout.write(rendered[fmt])
  if not out_dir:
    return []
  if dest is None:
    with output.Destination(out_dir) as held:
      return held.write(lambda folder: write(out, hist, folder, rendered))
  return dest.write(lambda folder: write(out, hist, folder, rendered))


def analysis_and_histories(args):
  """(analysis.numbers.answer.study_analysis's Analysis, the histories) of the command line;
  each stage that lasts over 2 s says so on stderr (cli.stage)."""
  with cli.stage(COMMAND, f'reading {" ".join(args.runs) if args.runs else args.csv}'):
    frame, hist, declared, source = load(args)
  with cli.stage(
    COMMAND,
    f'{len(frame)} runs: testing the contrasts, the gap decomposition, the '
    'attribution and the agreement',
  ):
    out = study_analysis(
      frame,
      declared,
      args.group_by,
      args.metric,
      args.margin,
      args.margin_reason,
      args.seed_col,
      args.scale,
      args.all_pairs,
      source,
      read_predictions=inputs.read_predictions if args.runs else None,
      compare=declaration.parse_compare(args.compare),
    )
  return out, hist


def main(argv=None):
  cli.locale_proof()
  args = parse_args(argv)
  try:
    cli.check_out_folder(args.out)
  except ValueError as e:
    cli.fail(e)
  with cli.destination(args.out) as dest:  # --out locked before any compute, written at once
    out, hist = analysis_and_histories(args)
    with cli.stage(
      COMMAND,
      'the report'
      + (f', its tables, the attribution and the figures into {args.out}' if args.out else ''),
    ):
      written = publish(out, hist, args.format, args.out, dest)
  for path in written:
    print(f'wrote {path}', file=sys.stderr)


if __name__ == '__main__':
  main()
