"""The words of the statistics report: the study's setup and a verdict per pair of arms.

Verdict of a pair (α = 0.05, p-values Holm-adjusted over the report's pairs):
  equivalent    the TOST p < α: the true difference lies within ±margin;
  different     the difference test (paired t when paired, else Welch) p < α and its 95% CI
                excludes 0;
  inconclusive  neither: the data cannot tell (say which side of the margin the 90% CI crosses).
"""

import sys

from analysis import inference as inf
from analysis import style
from analysis.style import num, pval

NOT_RECORDED = 'not recorded'


def signed(x):
  return f'{x:+.2f}'


def verdict(r, margin, unit, m):
  """(verdict, why) of one pair_table row `r`; m = the number of pairs Holm adjusts over."""
  holm = f'Holm over {m} pair{"s" if m > 1 else ""}'
  tost = f'TOST p = {pval(r["tost_p_holm"])} ({holm}; raw {pval(r["tost_p"])})'
  test = f'{r["test"]} p = {pval(r["test_p_holm"])} ({holm}; raw {pval(r["test_p"])})'
  ci90 = f'90% CI [{signed(r["ci90_low"])}, {signed(r["ci90_high"])}] {unit}'
  ci95 = f'95% CI [{signed(r["ci95_low"])}, {signed(r["ci95_high"])}] {unit}'
  if r['equivalent']:
    why = f'{tost} < {inf.ALPHA:g}: the difference lies within ±{margin:g} {unit} ({ci90})'
    if r['different']:
      why += f'; a nonzero difference is also detected ({test}, {ci95}), inside the margin'
    return 'equivalent', why
  if r['different']:
    return 'different', (f'{test} < {inf.ALPHA:g} and its {ci95} excludes 0; equivalence '
                         f'within ±{margin:g} {unit} not shown ({tost})')
  low, high = r['ci90_low'] <= -margin, r['ci90_high'] >= margin
  if low and high:
    where = f'the {ci90} is wider than the margin ±{margin:g} {unit} on both sides'
  elif low or high:
    where = f'the {ci90} extends past {"−" if low else "+"}{margin:g} {unit}'
  else:
    where = (f'the {ci90} lies inside ±{margin:g} {unit}, but the Holm-adjusted TOST p is not '
             f'below {inf.ALPHA:g}')
  return 'inconclusive', f'neither shown: {tost}; {test}; {where}'


def power_line(r, margin, unit):
  """What the design used could detect, and the seeds 80% power needs, from this pair's data."""
  what = 'pairs' if r['paired'] else 'seeds per arm'
  sd = 'sd of the per-seed differences' if r['paired'] else 'pooled sd'
  return (f'Power (estimated from n = {r["power_from"]}; {sd} {num(r["power_sd"])} {unit}; '
          f'α = {inf.ALPHA:g}): {num(r["power_diff"])} to detect a true Δ of ±{margin:g} {unit}, '
          f'{num(r["power_equiv"])} to show equivalence when the true Δ is 0; 80% power needs '
          f'{r["n80_diff"]} / {r["n80_equiv"]} {what}')


def verdict_lines(out):
  """One Markdown paragraph per pair: the verdict in bold, why, the design, the power."""
  unit = 'pp' if out['scale'] == 100 else 'units'
  lines = []
  for _, r in out['pairs'].iterrows():
    lines.append(f'- **{r["arm_a"]} vs {r["arm_b"]}: {r["verdict"]}.** Δ = mean A − mean B = '
                 f'{signed(r["diff"])} {unit}. Why: {r["verdict_why"]}. Design: {r["design"]}. '
                 f'{power_line(r, out["margin"], unit)}.')
  return lines or ['- no pair of arms with n ≥ 2 each: nothing to compare']


def facts(runs, *columns):
  """The distinct recorded values of the first of `columns` the table has, as text."""
  for col in columns:
    if col in runs:
      values = sorted({str(v) for v in runs[col].dropna()})
      if values:
        return values[0] if len(values) == 1 else ', '.join(values) + ' (differ between runs)'
  return NOT_RECORDED


def sizes(out):
  """'train 1437 / test 360 images; one test image = 0.278 pp' from the data.* columns."""
  runs = out['runs']
  train, test = facts(runs, 'data.train_size'), facts(runs, 'data.test_size')
  text = f'train {train} / test {test} images'
  try:
    one = 100.0 / float(test)
  except ValueError:
    return text
  return text + (f'; one test image = {one:.3g} pp' if out['scale'] == 100 else '')


def seed_lines(out):
  """The seeds: once when every arm has the same ones, else per arm."""
  if not out['seeded']:
    return ['seeds: no seed column: every row is its own run, so no pair is paired']
  per_arm = dict(zip(out['arms']['arm'], out['arms']['seeds']))
  if len(set(per_arm.values())) == 1:
    return [f'seeds (every arm): {next(iter(per_arm.values()))}']
  return [f'seeds of {arm}: {seeds}' for arm, seeds in per_arm.items()]


def title(out):
  """'Final test accuracy by arm: 3 arms, 5 seeds each (digits)': what the report compares."""
  name = out['metric'].replace('.', ' ').replace('_', ' ')
  arms = out['arms']
  count = sorted(set(arms['n'])) if not arms.empty else [0]
  what = 'seeds' if out['seeded'] else 'runs'
  each = f'{count[0]} {what} each' if len(count) == 1 else f'{count[0]}–{count[-1]} {what} per arm'
  dataset = facts(out['runs'], 'config.data.name', 'data.name')
  return (f'{name[0].upper()}{name[1:]} by arm: {len(arms)} arms, {each}'
          + (f' ({dataset})' if dataset != NOT_RECORDED else ''))


def arm_fields(out):
  """'differ in emulate; grouped by platform, device_kind, ...': the grouping fields, those whose
  values differ between the arms first."""
  short = lambda g: g.rsplit('.', 1)[-1]
  table = out['arms']
  differ = [short(g) for g in out['group_by']
            if g in table and table[g].astype(str).nunique() > 1]
  grouped = f'grouped by {", ".join(short(g) for g in out["group_by"])}'
  return f'differ in {", ".join(differ)}; {grouped}' if differ else grouped


def setup_lines(out):
  """The setup, one Markdown bullet each: data, sizes, training, arms, seeds, margin."""
  runs, unit = out['runs'], 'pp' if out['scale'] == 100 else 'units'
  arms = '; '.join(f'{r["arm"]} ({r["n"]} seeds, {r["n_runs"]} runs)' if out['seeded'] else
                   f'{r["arm"]} ({r["n_runs"]} runs)' for _, r in out['arms'].iterrows())
  dataset = facts(runs, 'config.data.name', 'data.name')
  lines = ([f'dataset: {dataset}, task {facts(runs, "config.data.task", "data.task")}; {sizes(out)}',
            f'training: {facts(runs, "config.num_epochs")} epochs, model '
            f'{facts(runs, "config.model.name")} width {facts(runs, "config.model.width")}, '
            f'resolution {facts(runs, "config.data.image_size", "data.image_size")} px']
           if dataset != NOT_RECORDED else
           ['dataset, train/test sizes, epochs, model width, resolution: not recorded (the table '
            'has no config.* / data.* columns)'])
  lines += [f'metric: {out["metric"]}' + (' (in %)' if out['scale'] == 100 else '')
            + (f'; runs read from {out["source"]}' if out.get('source') else ''),
            f'arms ({arm_fields(out)}): {arms}',
            *seed_lines(out),
            f'equivalence margin: ±{out["margin"]:g} {unit} ({out["margin_reason"]})',
            f'decisions at α = {inf.ALPHA:g}, p-values Holm-adjusted over '
            f'{len(out["pairs"])} pair(s)']
  return [f'- {line}' for line in lines]


def render(out, fmt):
  """The whole report as one Markdown or LaTeX string: setup, verdicts, then the tables."""
  arms_cap, pairs_cap = style.captions(out)
  setup, verdicts = setup_lines(out), verdict_lines(out)
  if fmt == 'latex':
    items = lambda lines: ''.join(rf'  \item {style.tex(l[2:].replace("**", ""))}' + '\n' for l in lines)
    return ''.join(['% Setup\n\\begin{itemize}\n', items(setup), '\\end{itemize}\n',
                    '% Verdict\n\\begin{itemize}\n', items(verdicts), '\\end{itemize}\n',
                    style.latex(style.display_arms(out), arms_cap),
                    style.latex(style.display_pairs(out), pairs_cap),
                    *(style.latex(rows, heading) for heading, rows in style.tables(out))])
  parts = [f'# {title(out)}\n', '\n## Setup\n\n',
           '\n'.join(setup) + '\n', '\n## Verdict\n\n', '\n'.join(verdicts) + '\n',
           f'\n## Arms\n\n{arms_cap}\n\n', style.markdown(style.display_arms(out)),
           f'\n## Pairwise comparisons\n\n{pairs_cap}\n\n', style.markdown(style.display_pairs(out))]
  for heading, rows in style.tables(out):
    parts += [f"\n## {heading}\n\n", style.markdown(rows)]
  if not out['small'].empty:
    parts += ['\n## Arms with n < 2 (tests skipped)\n\n', ', '.join(out['small']['arm']) + '\n']
  return ''.join(parts)


def csv_tables(out):
  """{name: DataFrame} of the full-precision tables written in CSV mode."""
  return {'arms': out['arms'], 'pairs': out['pairs'], 'replicates': out['replicates'],
          'excluded': out['excluded']}


def write_report(out, fmt, path=None):
  """Print the report, or write it to `path` (CSV: one file per table, PATH_<table>.csv)."""
  if fmt == 'csv':
    for name, table in csv_tables(out).items():
      if path:
        stem = path[:-4] if path.endswith('.csv') else path
        table.to_csv(f'{stem}_{name}.csv', index=False)
      else:
        sys.stdout.write(f'# {name}\n{table.to_csv(index=False)}\n')
    return
  text = render(out, fmt)
  if path:
    with open(path, 'w', encoding='utf-8') as f:
      f.write(text)
  else:
    sys.stdout.write(text)
