"""The report's words: the one-page answer, the setup, why each verdict, every table (Markdown and
booktabs LaTeX) and the attribution's report; nothing is judged here (docs/statistics.md)."""

import collections
import math

import numpy as np
import pandas as pd

from analysis import agreement, attribution, declaration, inputs, stats
from analysis.inputs import seed_text


def num(x, digits=2):
  """A table number: fixed digits, small p-values as '<0.001', missing as '–'."""
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '–'
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    return str(x)
  return f'{x:.{digits}f}'


def pval(p):
  """p-value text: 3 significant places, '<0.001' below."""
  if p is None or (isinstance(p, float) and math.isnan(p)):
    return '–'
  return '<0.001' if p < 0.001 else f'{p:.3f}'


def display_arms(out):
  """The per-arm table as strings, for Markdown/LaTeX (with the short label when declared)."""
  unit = ' (%)' if out.scale == 100 else ''
  info = out.arm_info
  short = dict(zip(info['arm'], info['label'], strict=True)) if info is not None else {}
  several = info is not None and info['platform'].nunique() > 1
  platform = dict(zip(info['arm'], info['platform'], strict=True)) if several else {}
  return [
    {
      **({'platform': platform[r['arm']]} if several else {}),
      'arm': short.get(r['arm'], r['arm']),
      'n': str(r['n']),
      'runs': str(r['n_runs']),
      f'mean{unit}': num(r['mean']),
      'sd': num(r['sd']),
      '95% CI': f'[{num(r["ci_low"])}, {num(r["ci_high"])}]',
      'CI method': r['ci_method'],
      'within-seed sd': (f'{num(r["within_sd"])} (df {r["within_df"]})' if r['within_df'] else '–'),
      'deterministic': {True: 'yes', False: f'no ({r["determinism"]})'}.get(
        r['deterministic'], f'unknown ({r["determinism"]})'
      ),
      **({'seeds': r['seeds']} if not short else {}),
    }
    for _, r in out.arms.iterrows()
  ]


def display_pairs(pairs, unit):
  """A pair or contrast table as strings, for Markdown/LaTeX (p-values: raw (Holm)); Δ in `unit`."""

  def both(r, t):
    return f'{pval(r[t + "_p"])} ({pval(r[t + "_p_holm"])})'

  def eq(r):
    return ('yes' if r['equivalent'] else 'no') + (
      f' (raw: {"yes" if r["equivalent_raw"] else "no"})'
      if r['equivalent'] != r['equivalent_raw']
      else ''
    )

  rows = []
  for _, r in pairs.iterrows():
    row = {
      'A': r['arm_a'],
      'B': r['arm_b'],
      'verdict': r['verdict'],
      f'Δ A−B ({unit})': num(r['diff']),
    }
    row |= {'95% CI': ci(r, 'ci95_low', 'ci95_high'), '90% CI': ci(r, 'ci90_low', 'ci90_high')}
    tests = {
      'equiv. (Holm TOST)': eq(r),
      'TOST p': both(r, 'tost'),
      'Welch p': both(r, 'welch'),
      'paired p': both(r, 'paired') if r['paired'] else '–',
      'rank test p (method)': (
        f'{r["rank_test"]} {both(r, "rank")}, '
        f'{r["signed_rank_method"] if r["paired"] else r["mw_method"]}'
      ),
      'effect size': f'd_z {num(r["d_z"])}' if r['paired'] else f"Hedges' g {num(r['hedges_g'])}",
    }
    if r['verdict'] == 'identical arithmetic':  # reported, not tested: no test column filled
      tests = dict.fromkeys(tests, 'not tested')
    seeds = '–' if r['verdict'] == 'identical arithmetic' else f'{r["n80_diff"]}/{r["n80_equiv"]}'
    rows.append({**row, **tests, 'seeds 80% (Δ/eq.)': seeds})
  return rows


def markdown(rows):
  """A Markdown table from a list of equal-keyed dicts of strings."""
  if not rows:
    return '(none)\n'
  cols = list(rows[0])
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + '|'.join('---' for _ in cols) + '|']
  lines += ['| ' + ' | '.join(str(r[c]).replace('|', '\\|') for c in cols) + ' |' for r in rows]
  return '\n'.join(lines) + '\n'


# LaTeX's specials and the report's symbols, as LaTeX writes them.
TEX = {c: '\\' + c for c in '&%$#_{}'} | {'\\': r'\textbackslash{}', '~': r'\textasciitilde{}'}
SYMBOLS: tuple[str, ...] = (r'\^{}', r'$\Delta$', '$-$', r'$<$', r'$>$', '--', r'$\pm$', r'$\geq$')
SYMBOLS += (r'$\leq$', r'$\alpha$')
TEX |= dict(zip('^Δ−<>–±≥≤α', SYMBOLS, strict=True))


def tex(s):
  """Escape LaTeX specials in a cell."""
  return ''.join(TEX.get(ch, ch) for ch in str(s))


def latex(rows, caption, label=None):
  """A booktabs LaTeX table (\\usepackage{booktabs}): number columns right-aligned, text left."""
  if not rows:
    return f'% {caption}: none\n'
  cols = list(rows[0])

  def numeric(text):  # a number or an interval: right-aligned
    return bool(text) and (text[0] in '+-−–[<' or text[0].isdigit())

  align = ''.join('r' if all(numeric(str(r[c])) for r in rows) else 'l' for c in cols)
  body = [' & '.join(tex(r[c]) for c in cols) + r' \\' for r in rows]
  head = [r'\begin{table}[t]', r'\centering', r'\small', r'\begin{tabular}{' + align + '}']
  head += [r'\toprule', ' & '.join(tex(c) for c in cols) + r' \\', r'\midrule']
  tail = [r'\bottomrule', r'\end{tabular}', rf'\caption{{{tex(caption)}}}']
  tail += [rf'\label{{{label}}}'] if label else []
  return '\n'.join([*head, *body, *tail, r'\end{table}']) + '\n'


def captions(out, pairs):
  """(arms caption, caption of the judged `pairs` table) saying what the numbers are."""
  unit = out.unit
  per = 'seed (replicates of a seed averaged)' if out.seeded else 'run (no seed column)'
  arms = (
    f'{out.metric} per arm: n = number of {"seeds" if out.seeded else "runs"}, one '
    f'value per {per}; sd between them; 95% CI of the mean by the method named '
    f'(t-interval below n = {stats.BCA_MIN_N}, where the BCa bootstrap under-covers, and '
    f'from n = {stats.BCA_MAX_N:,}, where the two agree); within-seed sd: '
    f'spread of replicates of one seed (nondeterminism), pooled, with its df. '
    f'Arms by {", ".join(out.group_by)}.'
  )
  pairs = (
    f'Δ = mean A − mean B in {unit} (over shared seeds when paired); 95% CI of the '
    f'difference test (paired t when paired, else Welch); 90% CI and TOST against the '
    f'margin ±{out.margin:g} {unit}; equivalent: Holm-adjusted TOST p < '
    f'{stats.ALPHA:g} (raw decision in brackets when it differs); p-values raw (Holm '
    f'over the {stats.family_size(pairs)} comparison(s) tested; '
    'identical arithmetic is not tested); '
    f'seeds (pairs when paired) for 80% power, α = {stats.ALPHA:g}, at Δ = margin / for '
    'equivalence.'
  )
  return arms, pairs


def signed(x):
  return '–' if x != x else f'{x:+.2f}'


def interval(low, high):
  return '' if low != low else f'[{signed(low)}, {signed(high)}]'


def pair_name(d):
  """'gpu − cpu': a decomposition's platform pair as the report writes it."""
  return d.gap.replace(' - ', ' − ')


def ci95(e):
  """The 95% interval of an attribution.Estimate, signed."""
  return interval(e.ci_low, e.ci_high)


def ci90(t):
  """The 90% interval of an attribution.Tost, signed."""
  return interval(t.ci90_low, t.ci90_high)


def ci(r, low='ci_low', high='ci_high'):
  return f'[{num(r[low])}, {num(r[high])}]'


def component_rows(table, gap_label, unit, margin):
  """Every component of one gap as rows of strings: estimate, 95% CI, p; G and R's TOST."""
  rows = []
  for _, r in table[table['gap'] == gap_label].iterrows():
    tost = r['key'] in ('G', 'R') and margin and r['note'] == ''
    rows.append(
      {
        'component': r['component'],
        f'estimate ({unit})': signed(r['estimate']) if r['note'] == '' else r['note'],
        '95% CI': interval(r['ci_low'], r['ci_high']) if r['note'] == '' else '',
        'p': pval(r['p']) if r['note'] == '' else '',
        '90% CI': interval(r['ci90_low'], r['ci90_high']) if tost else '',
        f'TOST p (±{margin:g})' if margin else 'TOST p': pval(r['tost_p']) if tost else '',
      }
    )
  return rows


def share_line(d):
  """The share of the gap the numerics part accounts for, with its interval and method."""
  if d.share != d.share:
    return 'share of the gap explained by numerics: not estimable (no numerics part)'
  if not np.isfinite(d.share_ci_low):
    return (
      f'share of the gap explained by numerics: N / G = {d.share:.2f}, 95% CI unbounded '
      f'({d.share_method}: the gap is not shown to be nonzero)'
    )
  return (
    f'share of the gap explained by numerics: N / G = {d.share:.2f} (95% CI '
    f'[{d.share_ci_low:.2f}, {d.share_ci_high:.2f}], {d.share_method}; '
    f'"explained" needs the lower bound ≥ {d.min_share:g})'
  )


VARIANCE_CAPTION = (
  'Where the variance between runs of one arm comes from: the two-way crossed '
  'random-effects ANOVA (method of moments) of init seed × data-order seed (× replicates); '
  'variance in {unit}², sd in {unit}, share of the total; 95% interval of each variance '
  "by Satterthwaite's df (exact χ² for a single mean square), none below "
  f'{stats.MIN_CI_DF:g} df (the upper bound would exceed 39× the estimate).'
)


def truncation(r, unit):
  """The truncation of a negative estimate in words ('' when none)."""
  if not r['truncated']:
    return ''
  return (
    f'estimated {r["estimate"]:+.3g} {unit}², below 0, so set to 0: the data show no '
    f'{r["component"]} variance beyond what the other sources give at these seeds'
  )


def variance_design(group):
  """'3 init × 3 data-order seeds × 2 replicates (18 runs)' of one arm's rows."""
  ms = group.set_index('component')
  i, j = int(ms.loc['init', 'df']) + 1, int(ms.loc['data order', 'df']) + 1
  r = int(group['replicates'].iloc[0])
  reps = f' × {r} replicates' if r > 1 else ', no replicates'
  return f'{i} init × {j} data-order seeds{reps} ({int(group["runs"].iloc[0])} runs)'


def variance_rows(table, unit, labels=None):
  """One row of strings per arm and component: arm, design, component, variance, sd, share."""
  labels = labels or {}
  out = []
  for arm, group in table.groupby('arm', sort=False):
    for _, r in group.iterrows():
      row = {'arm': labels.get(arm, arm), 'design': variance_design(group)}
      row |= {'component': r['component'], f'variance ({unit}²)': num(r['variance'], 3)}
      row |= {f'sd ({unit})': num(r['sd'], 3), 'share (%)': num(r['share_pct'], 1)}
      out.append(row | {'95% CI of the variance': variance_ci(r), 'note': truncation(r, unit)})
  return out


def variance_ci(r):
  """A component's 95% interval in words, or why it has none (truncated, exactly 0, few df)."""
  if r['truncated']:
    return 'none: estimate truncated at 0'
  if not r['estimate'] > 0:
    return 'none: estimate exactly 0 (no spread between these runs)'
  if not np.isfinite(r['ci_low']):
    return f'none: df {r["ci_df"]:.2g} < {stats.MIN_CI_DF:g} (more seeds needed)'
  return f'[{num(r["ci_low"], 3)}, {num(r["ci_high"], 3)}] (df {r["ci_df"]:.2g})'


NOT_RECORDED = 'not recorded'


def facts(runs, *columns):
  """The distinct recorded values of the first of `columns` the runs have (inputs.recorded)."""
  text = inputs.recorded(runs, *columns)
  return NOT_RECORDED if text is None else text


def rank_bound(r):
  """(smallest p the rank test can give, 'n seeds') when only the rank test kept a row from
  'different' (its t-test Holm p < α and 95% CI excluding 0), else None."""
  shown = r['test_p_holm'] < stats.ALPHA and (r['ci95_low'] > 0 or r['ci95_high'] < 0)
  if r['different'] or not shown or not r['rank_p_holm'] >= stats.ALPHA:
    return None
  sizes = (r['n_pairs'],) if r['paired'] else (r['n_a'], r['n_b'])
  return stats.rank_floor(*sizes), ' + '.join(str(int(n)) for n in sizes) + ' seeds'


def contrast_verdict(r, margin):
  """The verdict in a few words, from a contrast row: 'within margin (a difference shown)'."""
  if r['verdict'] == 'equivalent' and (r['ci95_low'] > 0 or r['ci95_high'] < 0):
    return 'equivalent (its 95% CI excludes 0 before Holm, not after)'
  if r['verdict'] == 'not equivalent':
    return f'not equivalent: 90% CI wholly past {"−" if r["ci90_high"] < 0 else "+"}{margin:g}'
  if r['power_sd'] == 0 and r['verdict'] != 'identical arithmetic':
    return r['verdict'] + ' (exact: no variance)'
  if r['verdict'] != 'inconclusive':
    return r['verdict'] + {
      'identical arithmetic': ' (not tested)',
      'within margin': ' (a difference shown)',
    }.get(r['verdict'], '')
  bound = rank_bound(r)
  if bound and bound[0] >= stats.ALPHA:
    return f'inconclusive: the rank test cannot reach α = {stats.ALPHA:g} at {bound[1]}'
  low, high = r['ci90_low'] <= -margin, r['ci90_high'] >= margin
  if low or high:
    return f'inconclusive: 90% CI past {"±" if low and high else "−" if low else "+"}{margin:g}'
  return 'inconclusive: Holm TOST p ≥ 0.05'


def contrast_rows(out, table):
  """One row of strings per contrast: platform (when several), arm, Δ, CIs, floor, verdict."""
  several = table['platform'].nunique() > 1 if 'platform' in table else False
  rows = []
  for _, r in table.iterrows():
    floor = out.noise.get(r.get('platform'))
    half = floor.half if floor else None
    floor = (
      '–' if half is None else 'within' if abs(r['diff']) - half <= stats.RESOLUTION else 'beyond'
    )
    row = {'platform': r['platform']} if several else {}
    if 'label' in r:
      row['arm − reference'] = r['label']
    else:
      row['A − B'] = f'{r["arm_a"]} − {r["arm_b"]}'
    row[f'Δ ({out.unit})'] = signed(r['diff'])
    row |= {'95% CI': interval(r['ci95_low'], r['ci95_high'])}
    row |= {'90% CI': interval(r['ci90_low'], r['ci90_high']), 'noise floor': floor}
    rows.append(row | {'verdict (Holm)': contrast_verdict(r, out.margin)})
  return rows


def variance_table(out):
  """The variance split's rows of strings (variance_rows), None without a split."""
  split = out.agreement.variance if out.agreement else None
  if split is None or split.empty:
    return None
  return variance_rows(split, out.unit, stats.arm_short_labels(out))


def verdict_why(r, margin, unit, m):
  """Why pair_table/contrast row `r` got its verdict; m = the number of pairs Holm adjusts over."""
  if r['verdict'] == 'identical arithmetic':
    return (
      "the two arms ran the same effective arithmetic on one platform (their records' "
      'numerics.effective fields are equal) and every paired difference is exactly 0: '
      'not tested, outside the Holm family'
    )
  holm = f'Holm over {m} pair{"s" if m > 1 else ""}'
  if r['power_sd'] == 0:
    each = 'paired difference' if r['paired'] else 'value of each arm'
    return (
      f'every {each} is the same (Δ {signed(r["diff"])} {unit} on every seed): no variance, so '
      f'the tests are exact: t-test p = {pval(r["test_p"])}, TOST p = {pval(r["tost_p"])} (|Δ| '
      f'{"<" if r["tost_p"] == 0 else "≥"} {margin:g} {unit}); {holm}'
    )

  def test(name, key):
    return f'{name} p = {pval(r[key + "_p_holm"])} ({holm}; raw {pval(r[key + "_p"])})'

  tost, shown, rank = test('TOST', 'tost'), test(r['test'], 'test'), test(r['rank_test'], 'rank')
  ci90 = f'90% CI [{signed(r["ci90_low"])}, {signed(r["ci90_high"])}] {unit}'
  ci95 = f'95% CI [{signed(r["ci95_low"])}, {signed(r["ci95_high"])}] {unit}'
  if r['equivalent']:
    why = f'{tost} < {stats.ALPHA:g}: the difference lies within ±{margin:g} {unit} ({ci90})'
    if r['different']:
      why += f'; a nonzero difference is also detected ({shown}, {ci95}), inside the margin'
    return why
  if r['different']:
    also = (
      f'; on the {r["lattice"]:.3g}-{unit} lattice of the metric the {rank} agrees'
      if r['lattice'] == r['lattice'] and r['lattice'] is not None
      else ''
    )
    return (
      f'{shown} < {stats.ALPHA:g} and its {ci95} excludes 0{also}; equivalence within '
      f'±{margin:g} {unit} not shown ({tost})'
    )
  bound = rank_bound(r)
  low, high = r['ci90_low'] <= -margin, r['ci90_high'] >= margin
  if r['verdict'] == 'not equivalent':
    side = '−' if r['ci90_high'] < 0 else '+'
    where = f'not equivalent: the {ci90} lies wholly past {side}{margin:g} {unit}'
  elif low and high:
    where = f'the {ci90} is wider than the margin ±{margin:g} {unit} on both sides'
  elif low or high:
    where = f'the {ci90} extends past {"−" if low else "+"}{margin:g} {unit}'
  else:
    where = (
      f'the {ci90} lies inside ±{margin:g} {unit}, but the Holm-adjusted TOST p is not '
      f'below {stats.ALPHA:g}'
    )
  if bound is None:
    return f'neither shown: {tost}; {shown}; {rank}; {where}'
  rule = f'cannot reach α = {stats.ALPHA:g} at {bound[1]} (its smallest two-sided p is '
  rule = rule + f'{bound[0]:.3g})' if bound[0] >= stats.ALPHA else 'is not below α after Holm'
  lattice = 'the rank test, required on a lattice metric'
  return f'{shown} and its {ci95} excludes 0, but {rank}: {lattice}, {rule}; {where}'


def judged(out):
  """The table the report judges: the declared contrasts, else every pair."""
  return out.contrasts if out.contrasts is not None else out.pairs


def verdict_lines(out):
  """One line per judged comparison: the verdict in bold, Δ, why, the design, the power."""
  unit, table = out.unit, judged(out)
  several = out.contrasts is not None and not table.empty and table['platform'].nunique() > 1
  lines = []
  for _, r in table.iterrows():
    name = f'{r["arm_a"]} vs {r["arm_b"]}'
    if out.contrasts is not None:
      name = (f'{r["platform"]}: ' if several else '') + f'{r["label"]} − reference'
    what = 'pairs' if r['paired'] else 'seeds per arm'
    sd = 'sd of the per-seed differences' if r['paired'] else 'pooled sd'
    power = (
      ''
      if r['verdict'] == 'identical arithmetic'
      else f' Power (estimated from n = {r["power_from"]}; {sd} {num(r["power_sd"])} {unit}; '
      f'α = {stats.ALPHA:g}): {num(r["power_diff"])} to detect a true Δ of '
      f'±{out.margin:g} {unit}, {num(r["power_equiv"])} to show equivalence when the true Δ is '
      f'0; 80% power needs {r["n80_diff"]} / {r["n80_equiv"]} {what}.'
    )
    lines.append(
      f'- **{name}: {r["verdict"]}.** Δ = {signed(r["diff"])} {unit}. Why: '
      f'{verdict_why(r, out.margin, unit, stats.family_size(table))}. Design: {r["design"]}.{power}'
    )
  return lines or ['- no pair of arms with n ≥ 2 each: nothing to compare']


def sizes(out):
  """'train 1437 / test 360 images; one test image = 0.278 pp' from the data.* columns."""
  train, test = facts(out.runs, 'data.train_size'), facts(out.runs, 'data.test_size')
  text = f'train {train} / test {test} images'
  try:
    one = 100.0 / float(test)
  except ValueError:
    return text
  return text + (f'; one test image = {one:.3g} pp' if out.scale == 100 else '')


def title(out):
  """'Final test accuracy by arm: 3 arms, 5 seeds each (digits)' ('8 arms on 2 platforms (cpu)."""
  name = out.metric.replace('.', ' ').replace('_', ' ')
  arms, info = out.arms, out.arm_info
  count = sorted(set(arms['n'])) if not arms.empty else [0]
  what = 'seeds' if out.seeded else 'runs'
  each = f'{count[0]} {what} each' if len(count) == 1 else f'{count[0]}–{count[-1]} {what} per arm'
  dataset = facts(out.runs, 'config.data.name', 'data.name')
  platforms = sorted(set(info['platform'])) if info is not None else []
  where = (
    f'{info["label"].nunique()} arms on {len(platforms)} platforms ({", ".join(platforms)})'
    if len(platforms) > 1
    else f'{len(arms)} arms'
  )
  return f'{name[0].upper()}{name[1:]} by arm: {where}, {each}' + (
    f' ({dataset})' if dataset != NOT_RECORDED else ''
  )


def setup_lines(out):
  """The setup, one Markdown bullet each: data, sizes, training, arms, seeds, margin."""
  runs, unit, name = out.runs, out.unit, stats.arm_short_labels(out)
  arms = '; '.join(
    f'{name[r["arm"]]} ({r["n"]} seeds, {r["n_runs"]} runs)'
    if out.seeded
    else f'{name[r["arm"]]} ({r["n_runs"]} runs)'
    for _, r in out.arms.iterrows()
  )
  short = [g.rsplit('.', 1)[-1] for g in out.group_by]
  differ = [
    s
    for g, s in zip(out.group_by, short, strict=True)
    if g in out.arms and out.arms[g].astype(str).nunique() > 1
  ]
  fields = f'grouped by {", ".join(short)}'
  fields = f'differ in {", ".join(differ)}; {fields}' if differ else fields
  dataset = facts(runs, 'config.data.name', 'data.name')
  lines = (
    [
      f'dataset: {dataset}, task {facts(runs, "config.data.task", "data.task")}; {sizes(out)}',
      f'training: {facts(runs, "config.num_epochs")} epochs, model '
      f'{facts(runs, "config.model.name")} width {facts(runs, "config.model.width")}, '
      f'resolution {facts(runs, "config.data.image_size", "data.image_size")} px',
    ]
    if dataset != NOT_RECORDED
    else [
      'dataset, train/test sizes, epochs, model width, resolution: not recorded (the table '
      'has no config.* / data.* columns)'
    ]
  )
  per_arm = dict(zip(out.arms['arm'], out.arms['seeds'], strict=True)) if out.seeded else {}
  seeds = (
    ['seeds: no seed column: every row is its own run, so no pair is paired']
    if not out.seeded
    else [f'seeds (every arm): {next(iter(per_arm.values()))}']
    if len(set(per_arm.values())) == 1
    else [f'seeds of {arm}: {seeds}' for arm, seeds in per_arm.items()]
  )
  lines += [
    f'metric: {out.metric}'
    + (' (in %)' if out.scale == 100 else '')
    + (f'; runs read from {out.source}' if out.source else ''),
    f'arms ({fields}): {arms}',
    *seeds,
    f'equivalence margin: ±{out.margin:g} {unit} ({out.margin_reason})',
    f'decisions at α = {stats.ALPHA:g}, p-values Holm-adjusted over the '
    f'{stats.family_size(judged(out))} comparisons tested (identical arithmetic is reported, '
    'not tested)',
  ]
  return [f'- {line}' for line in lines]


def labelled(out, table):
  """The table with arm_a/arm_b as short labels (the declaration's) where the study has them."""
  if table.empty:
    return table
  short = stats.arm_short_labels(out)
  return table.assign(arm_a=table['arm_a'].map(short), arm_b=table['arm_b'].map(short))


def details(out):
  """[(heading, caption, rows)] of the tables after the answer and the verdict lines."""
  arms_cap, pairs_cap = captions(out, judged(out))
  table = labelled(out, judged(out))
  parts = [
    ('Arms', arms_cap, display_arms(out)),
    ('Comparisons: every test', pairs_cap, display_pairs(table, out.unit)),
  ]
  if out.contrasts is not None and not out.pairs.empty:
    heading = 'All pairs (--all-pairs; Holm over all pairs, not the declared family)'
    parts.append((heading, '', display_pairs(out.pairs, out.unit)))
  split = variance_table(out)
  if split is not None:
    caption = VARIANCE_CAPTION.format(unit=out.unit)
    parts.append(('Where the variance between runs comes from', caption, split))
  design = [{'A': r['arm_a'], 'B': r['arm_b'], 'design': r['design']} for _, r in table.iterrows()]
  reps = [
    {'arm': r['arm'], 'seed': str(r['seed']), 'runs': str(r['n_runs']), 'values': r['values']}
    | {'mean used': num(r['mean']), 'identical': 'yes' if r['identical'] else 'no'}
    for _, r in out.replicates.iterrows()
  ]
  excluded = [{'run': r['run'], 'reason': r['reason']} for _, r in out.excluded.iterrows()]
  return parts + [
    ('Design of each comparison', '', design),
    ('Repeated seeds (replicates averaged; their spread is the within-seed sd)', '', reps),
    ('Runs excluded', '', excluded),
  ]


def render(out, fmt):
  """The whole report as one string."""

  if fmt == 'latex':
    split = variance_table(out)
    extra = (
      '' if split is None else latex(split, VARIANCE_CAPTION.format(unit=out.unit), 'tab:variance')
    )
    arms = latex(display_arms(out), captions(out, judged(out))[0], 'tab:arms')
    unit, parts = out.unit, []
    att = out.attribution
    for d in att.decomposition if att else []:
      caption = f'{d.gap} decomposition at ±{d.margin:g} {unit}: {d.verdict}. {share_line(d)}.'
      label = 'tab:gap-' + '-'.join(d.gap.replace(' - ', ' ').split())
      parts.append(latex(component_rows(att.gap, d.gap, unit, d.margin), caption, label))
    table = judged(out)
    if table is not None and not table.empty:
      caption = (
        f'Each arm minus the reference arm ({unit}), 95% and 90% CIs; verdicts Holm-adjusted '
        f'over the {stats.family_size(table)} contrasts tested, margin ±{out.margin:g} {unit}.'
      )
      parts.append(latex(contrast_rows(out, table), caption, 'tab:contrasts'))
    rows = [
      {'platform': p, 'device': f.device_kind or NOT_RECORDED}
      | {k: v or '–' for k, v in f.versions.items()}
      for p, f in out.software.platforms.items()
    ]
    if rows:
      parts.append(latex(rows, 'Platforms and library versions of the runs.', label='tab:software'))
    return ''.join(parts) + arms + extra
  parts = [
    f'# {title(out)}\n',
    '\n## Answer\n\n',
    '\n'.join(answer_lines(out) + excluded_lines(out)) + '\n',
    '\n## Setup\n\n',
    '\n'.join(setup_lines(out)) + '\n',
    '\n## Why each verdict, and its power\n\n',
    '\n'.join(verdict_lines(out)) + '\n',
  ]
  for heading, caption, rows in details(out):
    parts += [f'\n## {heading}\n\n', f'{caption}\n\n' if caption else '', markdown(rows)]
  if not out.small.empty:
    parts += ['\n## Arms with n < 2 (tests skipped)\n\n', ', '.join(out.small['arm']) + '\n']
  return ''.join(parts)


def counts(table, verdicts=stats.VERDICTS):
  """'3 equivalent, 11 inconclusive': the verdicts counted."""
  seen = collections.Counter(table['verdict'])
  return ', '.join(f'{seen[v]} {v}' for v in verdicts if seen[v])


UNITS = {'pp': 'pp (percentage points: accuracy x 100)'}


def numerics_state(d):
  n = ci95(d.N)
  if not d.N_estimable:
    return 'the numerics part is not estimable from the arms run'
  where = (
    f' (measured on {d.N_only} only: the other platform did not run both emulating '
    'profiles, so its interaction with the platform is untested)'
    if d.N_only
    else ''
  )
  if d.flags.numerics_shown:
    return f"the numerics part has the gap's sign and excludes 0 ({n}){where}"
  if d.flags.numerics_opposite:
    return f'the numerics part has the opposite sign ({n}){where}'
  return f"the numerics part's 95% CI {n} includes 0{where}"


def carriers(d):
  """What carries the residual R = fid_A − fid_B + P, in words."""
  (a, b), (ea, eb) = d.platforms, d.profiles
  parts = [
    (c, sign, name)
    for c, sign, name in (
      (d.fid_A, 1, f"{ea} not reproducing {a}'s native arithmetic on {a} (fid_A"),
      (d.fid_B, -1, f"{eb} not reproducing {b}'s native arithmetic on {b} (−fid_B"),
      (d.P, 1, 'the platforms under the same emulated arithmetic (P'),
    )
    if c.estimate == c.estimate
  ]

  def text(c, sign, name):
    low, high = sorted([sign * c.ci_low, sign * c.ci_high])
    return f'{name} {signed(sign * c.estimate)} {interval(low, high)})'

  found = [text(*p) for p in parts if attribution.shown(p[0].ci_low, p[0].ci_high)]
  if found:
    return 'carried by ' + ' and '.join(found)
  if not parts:
    return ''
  largest = max(parts, key=lambda p: abs(p[0].estimate))
  return f'no part of it is shown; the largest is {text(*largest)}'


def residual_state(d, unit):
  m = d.margin
  carried = carriers(d)
  if d.flags.residual_equivalent:
    return (
      f'the residual lies within ±{m:g} {unit} (90% CI {ci90(d.R_tost)}, TOST p {pval(d.R_tost.p)})'
    )
  if d.flags.residual_shown:
    return f'a residual remains (95% CI {ci95(d.R)} excludes 0)' + (
      f', {carried}' if carried else ''
    )
  if not m:
    return 'the residual cannot be shown within a margin (none given)'
  return f'the residual is neither shown nor within ±{m:g} {unit} (90% CI {ci90(d.R_tost)})' + (
    f'; {carried}' if carried else ''
  )


def holm_text(d):
  """' (Holm over the 3 pairs compared)' for several pairs, '' for one."""
  k = d.pairs_compared
  return f', Holm over the {k} pairs compared' if k > 1 else ''


def gap_state(d, unit):
  """Whether the gap is shown (paired t, with its Holm p over several pairs) and within ±m."""
  m, g90 = d.margin, ci90(d.G_tost)
  holm = (
    f'; paired-t p {pval(d.G_p_holm)}{holm_text(d)}'
    if d.pairs_compared > 1
    else ' excludes 0'
    if d.flags.gap_shown
    else ' includes 0'
  )
  shown = f'shown (95% CI {ci95(d.G)}{holm})'
  if d.flags.gap_equivalent:
    within = (
      f'lies within ±{m:g} {unit} (90% CI {g90}, TOST p {pval(d.G_tost_p_holm)}{holm_text(d)})'
    )
    return f'the native gap is {"" if d.flags.gap_shown else "not "}{shown} and {within}'
  nor = f' ±{m:g} {unit} (90% CI {g90})' if m else ' a margin (none was given)'
  if d.flags.gap_shown:
    return f'the native gap is {shown} and not within{nor}'
  return f'the native gap is neither {shown} nor within{nor}'


def why(d, unit):
  """Why the decomposition `d` (analysis/attribution.py judge_family) got its verdict."""
  text = gap_state(d, unit)
  if d.verdict == 'tests disagree' or d.flags.rank_shown != d.flags.gap_shown:
    k = d.pairs_compared
    p = pval(d.G_signed_rank_p_holm if k > 1 else d.G_signed_rank_p)
    can = (
      ''
      if d.G_signed_rank_attainable * k < stats.ALPHA
      else f'; at {d.seeds} seeds it cannot reach {stats.ALPHA:g}'
    )
    text += (
      f'; exact signed-rank p {p}{holm_text(d)}, {d.G_seeds_positive} of {d.seeds} '
      f'seeds above 0 and {d.G_seeds_negative} below{can}'
    )
  if d.verdict == 'tests disagree':
    return text + ': the t-interval and the signed-rank test disagree on whether there is a gap'
  if d.verdict == 'gap within margin':
    return text + ': a real gap, smaller than the margin'
  if d.verdict == 'no gap' or not d.flags.gap_shown:
    return text
  parts = [text, numerics_state(d)]
  if d.flags.numerics_shown:
    reaches = 'reaches' if d.flags.share_reaches else 'is below'
    parts.append(f"the share's lower 95% bound {reaches} the minimum {d.min_share:g}")
  parts.append(residual_state(d, unit))
  if d.flags.interaction_shown:
    parts.append(
      f'the numerics part differs between the platforms (N_A − N_B '
      f'{signed(d.N_interaction.estimate)} {ci95(d.N_interaction)}: '
      f'{signed(d.N_A.estimate)} on {d.platforms[0]}, {signed(d.N_B.estimate)} on '
      f'{d.platforms[1]}; N is their mean)'
    )
  return '; '.join(p for p in parts if p) + (f' (open: {d.open})' if d.open else '')


def seeds_line(d, unit):
  """The seeds (per arm) each part of a decisive answer needs at the observed per-seed sds."""
  if not d.margin:
    return (
      'seeds for 80% power: none computed (no margin, so no smallest effect of interest to power)'
    )
  m = f'±{d.margin:g} {unit}'
  names = {
    'gap nonzero': f'a gap of {m} shown ≠ 0',
    'numerics part nonzero': f'a numerics part of {m} shown ≠ 0',
    'gap within margin': f'a gap of 0 shown within {m}',
    'residual within margin': f'a residual of 0 shown within {m}',
  }
  parts = [f'{names[q]}: {n}' for q, n in d.seeds_needed.items()]
  return (
    f'seeds for 80% power (α = {stats.ALPHA:g}, paired t at the observed sd of each '
    f'per-seed component, at the margin, the smallest effect of interest; now '
    f'{d.seeds}): ' + ', '.join(parts)
  )


def cross_check_line(d, unit):
  """The mixed model's G, N and R over the same cells with the estimate's own definitions."""
  c = d.cross_check
  if 'G' not in c.contrasts and 'G' not in c.notes:
    return 'cross-check (mixed model over the same cells): fit failed'
  parts = [
    f'{k} {signed(c.contrasts[k].estimate)} '
    f'{interval(c.contrasts[k].ci_low, c.contrasts[k].ci_high)}'
    if k in c.contrasts
    else f'{k}: {c.notes[k]}'
    for k in ('G', 'N', 'R')
    if k in c.contrasts or k in c.notes
  ]
  same = f' (N from {d.N_only} only, as the estimate)' if d.N_only else ''
  return (
    f'cross-check, {c.method.split(" (")[0]} over the same cells{same} (one residual '
    f'variance for every cell): ' + ', '.join(parts) + f' {unit}'
  )


def decomposition_lines(d, table, unit):
  """Markdown lines of one gap's decomposition: table, verdict with why, share, seeds, check."""
  seeds = seed_text(pd.Series(d.seed_list, dtype=object))
  return [
    markdown(component_rows(table, d.gap, unit, d.margin)).rstrip('\n'),
    '',
    f'**{pair_name(d)}: {d.verdict}** — {why(d, unit)}.',
    f'Signed-rank p of the gap {pval(d.G_signed_rank_p)} ({d.G_signed_rank_method}); '
    f'd_z {num(d.G_d_z)}; seeds used {d.seeds} ({seeds}).',
    f'{share_line(d)}; {seeds_line(d, unit)}.',
    f'{cross_check_line(d, unit)}.',
  ]


def noise_text(out):
  """The noise floor in one sentence, each platform's number after the definition."""
  if not out.noise:
    return 'noise floor unavailable: no --noise-arm given, or it shares < 2 seeds with its base arm'
  floors = list(out.noise.items())
  descriptions = {f.what for _, f in floors}
  what = descriptions.pop() if len(descriptions) == 1 else 'the noise arm − the arm it perturbs'
  per = ', '.join(
    f'{p + " " if p else ""}±{f.half:.3f} {out.unit} (sd {f.sd:.3f}, {f.n} seeds)'
    for p, f in floors
  )
  return (
    f'noise floor (95% half-width of the mean paired difference {what}, '
    f't(0.975, n − 1) × sd / √n over the n seeds both ran): {per}'
  )


def attribution_report(out):
  """The attribution report as Markdown: model, method, units, the tables, the excluded runs."""
  u, labels = out.unit, out.labels or {}
  half = min((f.half for f in out.noise.values()), default=np.nan)
  lines = [
    f'# Attribution of {out.metric}' + (f' ({out.source})' if out.source else ''),
    '',
    f'model: {out.model}',
    f'method: {out.method}',
    f'runs: {out.n_runs} used, {len(out.excluded)} excluded, '
    f'{len(out.replicates)} arm/seed(s) run more than once (each run kept)',
    f"units: {UNITS.get(u, u)}; each term = difference from its factor's reference level "
    '(other factors fixed), 95% CI and two-sided p, no multiplicity correction',
    f'reference levels: {", ".join(f"{k}={v}" for k, v in out.reference.items())}',
    noise_text(out),
    '',
  ]

  def ratio(e):
    return num(abs(e) / half) if half > 0 else '–'

  terms = [
    {'term': labels.get(r['term'], r['term']), f'estimate ({u})': num(r['estimate'])}
    | {'95% CI': ci(r), 'p': pval(r['p'])}
    | {'abs. estimate / smallest noise half-width': ratio(r['estimate'])}
    for _, r in out.terms.iterrows()
  ]
  lines.append(markdown(terms))
  margin = (
    f'±{out.margin:g} {u}' + (f' ({out.margin_reason})' if out.margin_reason else '')
    if out.margin
    else 'none given'
  )
  lines += ['## Platform gap', '', gap_note(out), f'equivalence margin: {margin}', '']
  for d in out.decomposition:
    lines += decomposition_lines(d, out.gap, u) + ['']
  if out.arms is not None:
    arms = [
      {'arm': r['arm'], f'minus reference arm ({u})': num(r['estimate'])}
      | {'95% CI': ci(r), 'p': pval(r['p'])}
      for _, r in out.arms.iterrows()
    ]
    lines.append(markdown(arms))
  lines += [
    '## Excluded runs',
    '',
    markdown([{'run': r['run'], 'reason': r['reason']} for _, r in out.excluded.iterrows()]),
  ]
  return '\n'.join(lines)


def pairs_line(out):
  """Which platform pairs are decomposed, where they came from and how they enter the tests."""
  pairs = ', '.join(pair_name(d) for d in out.decomposition)
  source = {'compare': 'declared (compare)', '--compare': 'from --compare (exploratory)'}.get(
    out.compare_flag, 'every pair of the platforms run (none declared), tpu before gpu before cpu'
  )
  holm = (
    f"; each pair's gap tests (paired t, TOST, signed rank) Holm-adjusted over the "
    f'{len(out.decomposition)} pairs'
    if len(out.decomposition) > 1
    else ''
  )
  left = f'; left out: {out.pairs_note}' if out.pairs_note else ''
  said = kind_effects_text(out) if out.device_kinds == 'blocked' else ''
  said = f' Device kinds blocked (each seed the mean over its kinds): {said}.' if said else ''
  return f'Platform pairs (G = A − B): {pairs}, {source}{holm}{left}.{said}'


def gap_note(out):
  """How the gap was measured (pairs, native arm, emulation per platform)."""
  if out.native is None:
    return out.gap_note
  factor, level = out.native
  return (
    pairs_line(out) + ' '
    f"native arm {factor}={level}; emulation of each platform's native arithmetic: "
    + ', '.join(f'{p}={q}' for p, q in out.emulation.items())
    + '. Each component is a per-seed combination of the cells (platform, '
    f"{factor}) at the other factors' reference levels, its mean with a t-interval over "
    'seeds; G = fid_A − fid_B + N + P exactly. (The effects table above is the main-effects '
    f'model: its platform term averages different arithmetic, as {factor}={level} differs '
    'between platforms; it is not the gap.)'
  )


def row_name(r, several):
  """'bf16 activations' (or 'gpu: bf16 activations' with several platforms; 'A − B' unlabelled)."""
  name = (
    r['label'] if 'label' in r and isinstance(r['label'], str) else f'{r["arm_a"]} − {r["arm_b"]}'
  )
  return f'{r["platform"]}: {name}' if several and r.get('platform') else name


def listed(names, most=4):
  """'a, b and c' ('a, b, c, d and 3 more' beyond `most`)."""
  names = list(names)
  if len(names) > most:
    return ', '.join(names[:most]) + f' and {len(names) - most} more'
  return names[0] if len(names) == 1 else ', '.join(names[:-1]) + ' and ' + names[-1]


def metric_name(out):
  """'test accuracy': the metric's last field, in words."""
  return out.metric.rsplit('.', 1)[-1].replace('_', ' ')


def settings_clause(out):
  """Which settings changed the metric, by the contrasts' verdicts (every pair's, counted)."""
  table, metric = judged(out), metric_name(out)
  if table is None or table.empty:
    return ''
  if out.contrasts is None:
    return (
      f'{len(out.pairs)} pairs of arms compared on {metric} (no declared contrasts, Holm over '
      f'{stats.family_size(out.pairs)}): {counts(out.pairs)}'
    )
  several = 'platform' in table and table['platform'].nunique() > 1
  by = {v: [r for _, r in table.iterrows() if r['verdict'] == v] for v in set(table['verdict'])}
  m, unit = f'±{out.margin:g} {out.unit}', out.unit

  def show(rows):
    return listed(
      f'{row_name(r, several)} '
      f'({signed(r["diff"])} {interval(r["ci95_low"], r["ci95_high"])} {unit})'
      for r in rows
    )

  parts = []
  if by.get('different'):
    shown = f'a difference shown; within {m} not shown'
    parts.append(f'{show(by["different"])} changed {metric} ({shown})')
  if by.get('within margin'):
    parts.append(f'{show(by["within margin"])} changed it, by less than the margin {m}')
  if by.get('not equivalent'):
    parts.append(f'{show(by["not equivalent"])} changed it by more than {m} (90% CI wholly beyond)')
  if by.get('inconclusive'):
    parts.append(f'{listed(row_name(r, several) for r in by["inconclusive"])} are undecided')
  tested = len(table) - len(by.get('identical arithmetic', []))
  if by.get('equivalent'):
    lead = 'no numerics setting changed ' + metric if len(parts) == 0 else 'the others did not'
    parts.append(f'{lead} beyond {m} ({len(by["equivalent"])} of {tested} tested equivalent)')
  if by.get('identical arithmetic'):
    same = listed(row_name(r, several) for r in by['identical arithmetic'])
    parts.append(
      f"{same} {'is' if len(by['identical arithmetic']) == 1 else 'are'} the reference's "
      'own arithmetic (exactly 0, not tested)'
    )
  return '; '.join(parts)


def sentence(out):
  """'**Answer.** …' in one sentence: the gap of the question's pair."""
  table, platforms = judged(out), sorted(out.software.platforms)
  has = table is not None and 'platform' in table
  tested = sorted(set(table['platform'].astype(str))) if has else platforms
  left = [p for p in platforms if p not in tested]  # ran, but no contrast of theirs was tested
  where = f'on {listed(tested)}' + (f' ({listed(left)}: no contrast tested)' if left else '')
  where = f'{where}, ' if tested else ''
  settings = settings_clause(out)
  att, agree = out.attribution, out.agreement
  d = att.decomposition[0] if att and att.decomposition else None
  gap_text = (
    f'{pair_name(d)}: {d.verdict} (G {signed(d.G.estimate)} {ci95(d.G)} {out.unit} at '
    f'±{d.margin:g} {out.unit})'
    if d
    else ''
  )
  table = agree.table if agree else None
  read = agreement.against_seeds(table) if table is not None and not table.empty else None
  churn = (
    f'by churn, {read.changed} of {read.rows} settings changed the model: '
    f'{read.low:.2g}–{read.high:.2g} % of the test predictions differ from the '
    f"reference arm's, {read.ratio_low:.2g}–{read.ratio_high:.2g} × the "
    f'{read.base} between two seeds of one arm ({agreement.seed_verdict(read)})'
    if read is not None
    else ''
  )
  parts = [p for p in (gap_text, (where + settings) if settings else '', churn) if p]
  if not parts:
    return '**Answer.** Nothing to answer: no two arms with n ≥ 2 each were compared.'
  return f'**Answer.** {"; ".join(parts)}.'


def setting(runs):
  """'digits, resnet18 width 0.25, 4 epochs, 8 px': the recorded facts of the runs."""
  parts = [
    facts(runs, 'config.data.name', 'data.name'),
    f'{facts(runs, "config.model.name")} width {facts(runs, "config.model.width")}',
    f'{facts(runs, "config.num_epochs")} epochs',
    f'{facts(runs, "config.data.image_size", "data.image_size")} px',
  ]
  return ', '.join(p for p in parts if NOT_RECORDED not in p)


def compared(out):
  """[(a, b)] of the platform pairs the study answers: its decomposition's."""
  att = out.attribution
  if att and att.decomposition:
    return [tuple(d.platforms) for d in att.decomposition]
  return attribution.default_pairs(out.software.platforms)


def question(out):
  """What the study asks, from its platform pairs (the first is the question) and runs."""
  platforms, metric = sorted(out.software.platforms), metric_name(out)
  n = sorted(set(out.arms['n']))
  info = out.arm_info
  arms = info['label'].nunique() if info is not None else len(out.arms)
  pairs = compared(out)
  also = f' Also compared: {declaration.pairs_text(pairs[1:])}.' if len(pairs) > 1 else ''
  ask = (
    f'Does training on {pairs[0][0]} give the same {metric} as on {pairs[0][1]}, and which '
    f'numerical setting explains a difference?{also}'
    if len(platforms) > 1
    else f'Which numerical setting changes {metric} on '
    f'{platforms[0] if platforms else "this platform"}, beyond the noise floor?'
  )
  seeds = f'{n[0]}{"–" + str(n[-1]) if len(n) > 1 else ""} seeds per arm'
  what = ', '.join(p for p in (setting(out.runs), f'{arms} arms', seeds) if p)
  return (
    f'**Question.** {ask} ({what}.) Equivalence margin ±{out.margin:g} {out.unit}: '
    f'{out.margin_reason}.'
  )


# Without a declaration every pair is tested; beyond this many the answer gives their counts.
MAX_UNDECLARED_ROWS = 12


def contrast_lines(out):
  """The declared contrasts (or every pair without a declaration) with their verdicts."""
  table, unit, m = judged(out), out.unit, out.margin
  if table is None or table.empty:
    return ['**Comparisons:** none (no two arms with n ≥ 2 each).']
  floors = ', '.join(f'{p} ±{f.half:.2f}' for p, f in out.noise.items())
  ref = (
    out.arm_info.loc[out.arm_info['role'] == 'reference', 'label'].iloc[0]
    if out.contrasts is not None
    else None
  )
  head = (
    f'**Factor effects**: each arm − the reference arm ({ref}) on its platform, paired by '
    f'seed where the runs pair; Holm over the {stats.family_size(table)} declared contrasts tested'
    if ref
    else '**Comparisons** (no declared contrasts: every pair, '
    f'Holm over {stats.family_size(table)})'
  )
  floor = (
    f'; noise floor (95% half-width of the mean paired difference noise arm − the arm it '
    f"perturbs, at this study's seeds): {floors} {unit}"
    if floors
    else '; no noise floor'
  )
  rule = (
    f'{head}{floor}; margin ±{m:g} {unit}. Verdicts: equivalent = Holm TOST p < '
    f'{stats.ALPHA:g} (90% CI inside ±{m:g}); different = Holm p < {stats.ALPHA:g} and '
    '95% CI excluding 0 (on a lattice metric also the rank test); within margin = both: a '
    'difference shown, inside the margin (as "gap within margin"); identical arithmetic = '
    'equal effective numerics and every difference 0 (not tested, outside Holm); else '
    'inconclusive.'
  )
  if (table['verdict'] == 'not equivalent').any():
    rule = rule[:-1] + f'; not equivalent = the 90% CI wholly outside ±{m:g}, no difference shown.'
  if not ref and len(table) > MAX_UNDECLARED_ROWS:  # every pair of many arms: counts, not a page
    counts = table['verdict'].value_counts()
    said = ', '.join(f'{counts.get(v, 0)} {v}' for v in stats.VERDICTS[1:])
    return [
      f'{rule} {said}; every pair is in "Comparisons: every test" below. Declare the '
      "study's contrasts (get_study() in the config file, or --study FILE) to have them "
      'answered here.'
    ]
  return [rule, '', markdown(contrast_rows(out, table)).rstrip('\n')]


def seeds_used(d, declared):
  """'seeds 0–5' of a decomposition, or 'seeds 0 1 2 4 5 (5 of the 6 declared: 3 lacks a cell)'."""
  used = [str(s).split(' ')[0] for s in d.seed_list]  # '0 (init 0, data 1)': base seed 0
  text = f'seeds {seed_text(pd.Series(d.seed_list))}'
  text += f'; only {len(used)}: {len(used) - 1} df' if len(used) < 3 else ''
  left = [str(s) for s in declared or [] if str(s) not in used]
  if left:
    text += (
      f' ({len(used)} of the {len(declared)} declared: {", ".join(left)} '
      f'{"lacks" if len(left) == 1 else "lack"} a cell of the gap)'
    )
  return text


def headline(out):
  """'gpu − cpu: no gap (G +0.26 [-0.22, +0.75] pp, seeds 0–5); 13 contrasts tested: ...'."""
  declared = out.scope.declared_seeds if out.scope else None
  parts = [
    f'{pair_name(d)}: **{d.verdict}**{", but " + d.open if d.verdict[0] == "e" and d.open else ""}'
    f' (G {signed(d.G.estimate)} {ci95(d.G)} {out.unit}, '
    f'{seeds_used(d, declared)})'
    for d in (out.attribution.decomposition if out.attribution else [])
  ]
  table = judged(out)
  if table is not None and not table.empty:
    parts.append(
      f'{stats.family_size(table)} contrasts tested: {counts(table, stats.VERDICTS[1:])}'
    )
  return '; '.join(parts)


def scope_lines(out):
  """Confirmatory vs exploratory: the declared seeds at the declared margin first."""
  sc = out.scope
  if sc is None or sc.confirmatory is None:
    return ['**Exploratory**: the study declares no seeds or margin before its runs.', '']
  if sc.confirmatory:
    return [
      f'**Confirmatory**: the declared seeds at the declared margin '
      f'(±{sc.declared_margin:g} {out.unit}).',
      '',
    ]
  lines = [f'**Exploratory** ({"; ".join(sc.deviations)}).']
  conf = out.confirmatory
  if conf is not None:
    pairs = conf.attribution.decomposition if conf.attribution else []
    which = (
      f' and platform pairs {declaration.pairs_text([d.platforms for d in pairs])}' if pairs else ''
    )
    which += (
      f'; not analysed: {conf.attribution.pairs_note}'
      if conf.attribution and conf.attribution.pairs_note
      else ''
    )
    ran = set(conf.runs['platform'].astype(str)) if 'platform' in conf.runs else set()
    platforms = sorted(set(out.runs['platform'].astype(str))) if 'platform' in out.runs else []
    wanted = attribution.platform_pairs(platforms, out.declared.get('compare'), 'compare')[0]
    gone = [  # a declared (else default) pair one of whose platforms ran no declared seed
      f'{a} − {b}: {" and ".join(p for p in (a, b) if p not in ran)} ran none of the declared seeds'
      for a, b in wanted
      if (a not in ran or b not in ran) and f'{a} − {b}' not in which
    ]
    which += f'; not analysed: {"; ".join(gone)}' if gone else ''

    lines.append(
      f'**Confirmatory answer** (the declared seeds at the declared ±{conf.margin:g} '
      f'{out.unit}{which}): {headline(conf)}. The rest of this page is exploratory.'
    )
  elif sc.declared_seeds is None:
    lines.append('No confirmatory answer: the study declares no seeds to re-analyse.')
  elif not inputs.is_accuracy(out.metric):
    lines.append(f'No confirmatory answer: the declared margin (pp) is not one of {out.metric}.')
  else:
    lines.append('No confirmatory answer: the declared seeds were not all run.')
  return [' '.join(lines), '']


def answer_lines(out):
  """The one-page answer (Markdown lines) of an analyse.Analysis."""
  agreement = [] if not out.agreement else ['', out.agreement.summary]
  info = out.software
  software = []  # per platform (device, versions), the confound line when versions differ
  for platform, recorded in info.platforms.items():
    versions = ', '.join(f'{p} {v}' for p, v in recorded.versions.items() if v)
    devices = f' × {recorded.devices}' if recorded.devices else ''
    cpu = ', '.join(
      f'{f} {recorded.cpu[f]}'
      for f in ('cpu_model', 'cpu_isa', 'xla_cpu_isa')
      if recorded.cpu.get(f)
    )
    software.append(
      f'- {platform}: {recorded.device_kind or NOT_RECORDED}{devices}'
      f'{f" ({cpu})" if cpu else ""}; {versions or "versions not recorded"}'
    )
  recorded = any(v for f in info.platforms.values() for v in f.versions.values())
  if info.confounds:
    software.append(
      f'- **Confound:** {", ".join(info.confounds)} differ between the platforms; the '
      'platform gap and its residual include whatever those versions change.'
    )
  elif len(info.platforms) > 1 and recorded:
    software.append('- The platforms ran the same recorded library versions.')
  elif len(info.platforms) > 1:
    software.append(
      '- Library versions: not recorded, so whether the platforms ran the same software is unknown.'
    )
  section, unit, labels, split = out.agreement, out.unit, stats.arm_short_labels(out), []
  table = section.variance if section is not None else None
  if table is not None and not table.empty:
    for arm, group in table.groupby('arm', sort=False):
      parts = []
      for _, r in group.iterrows():
        ci = variance_ci(r)
        ci = f'variance 95% CI {ci}' if ci.startswith('[') else 'no interval: ' + ci[6:]
        parts.append(
          f'{r["component"]} {num(r["share_pct"], 0)} % (sd {num(r["sd"], 2)} {unit}; {ci})'
        )
      split.append(
        f'**Variance between runs** of {labels.get(arm, arm)} ({variance_design(group)}): '
        + ', '.join(parts)
        + '; intervals in "Where the variance comes from" below.'
      )
  for note in section.variance_notes if section is not None else []:
    split.append(f'**Variance between runs**: no split for {note}.')
  att, gap = out.attribution, []  # the decomposition of each platform gap
  if att and not att.decomposition:
    gap = [f'**Platform gap:** {att.gap_note}.', '']
  elif att:
    gap = [
      '**Platform gap** (per seed: native gap G = fid_A − fid_B + N + P, numerics part N, '
      f'residual R = G − N; mean over seeds with a t-interval; α = {stats.ALPHA:g}). '
      + pairs_line(att),
      '',
    ]
    for d in att.decomposition:
      gap += decomposition_lines(d, att.gap, out.unit) + ['']
  return [
    question(out),
    '',
    sentence(out),
    '',
    *scope_lines(out),
    "**Platforms and software** (from the runs' records):",
    *software,
    *kinds_lines(out),
    '',
    *gap,
    *contrast_lines(out),
    *agreement,
    *(['', *split] if split else []),
  ]


def kind_effects_text(att, platform=None):
  """'gpu-H100 − gpu-A100 -1.13 pp (95% CI [...], paired t over 8 seeds: 0–7)' of a blocked
  platform's kind effects ('' without any)."""
  effects = [e for e in att.kind_effects if platform in (None, e.platform)]
  said = [
    f'{e.kind} − {e.base} {signed(e.estimate)} {att.unit} (95% CI {interval(e.ci_low, e.ci_high)}'
    f', paired t over {len(e.seeds)} seeds: {seed_text(pd.Series(e.seeds))})'
    for e in effects
  ]
  return listed(said) if said else ''


def kinds_lines(out):
  """The first page's word on platforms split by device kind (inputs.split_device_kinds)."""
  runs = out.runs
  if inputs.RECORDED_PLATFORM not in runs:
    return []
  lines = []
  split = runs[runs['platform'].astype(str) != runs[inputs.RECORDED_PLATFORM].astype(str)]
  att = out.attribution
  blocked = att is not None and att.device_kinds == 'blocked'
  for name, group in split.groupby(inputs.RECORDED_PLATFORM, sort=True, observed=True):
    counts = group.groupby('platform', sort=True, observed=True).size()
    kinds = listed(f'{p} ({n} runs)' for p, n in counts.items())
    if not blocked:
      lines.append(
        f'- **Device kinds:** {name} ran on {len(counts)} device kinds, analysed as a platform '
        f'each with its own pairs, never pooled: {kinds}.'
      )
      continue
    said = kind_effects_text(att, name) or 'none (no seed ran on every kind)'
    lines.append(
      f'- **Device kinds:** {name} ran on {len(counts)} device kinds, {kinds}, pooled in its '
      f'platform pairs with the kind as a blocking factor (each seed the mean over the kinds, '
      f'on the seeds every kind ran; study device_kinds "blocked"); contrasts stay per kind. '
      f'Device kind effect at the native arm: {said}.'
    )
  return lines


def excluded_lines(out):
  """The first page's count of the runs left out, by reason (the Excluded table lists each run)."""
  excluded = out.excluded
  if excluded.empty:
    return []
  counted = excluded['reason'].value_counts()
  said = '; '.join(f'{n} {why}' for why, n in counted.head(5).items())
  more = f'; {len(counted) - 5} other reasons' if len(counted) > 5 else ''
  repair = (
    ' To repair them, run the sweep command that made them again (`python -m sweeps.sweep ...` '
    'or `make study`: completed runs are skipped, the others rerun or resumed from their last '
    'checkpoint), then this analysis.'
    if (excluded['status'] != 'completed').any()
    else ''
  )
  return [
    '',
    f'**Excluded:** {len(excluded)} of {len(excluded) + len(out.runs)} runs ({said}{more}); each '
    f'is listed under "Runs excluded" below.{repair}',
  ]
