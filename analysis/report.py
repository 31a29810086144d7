"""The report's words: the one-page answer, the setup, why each verdict, every table (Markdown and
booktabs LaTeX) and the attribution's report; nothing is judged here (docs/statistics.md)."""

import collections
import math

import numpy as np

from analysis import inference, inputs, stats


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
    f'(t-interval below n = {inference.BCA_MIN_N}, where the BCa bootstrap under-covers, and '
    f'from n = {inference.BCA_MAX_N:,}, where the two agree); within-seed sd: '
    f'spread of replicates of one seed (nondeterminism), pooled, with its df. '
    f'Arms by {", ".join(out.group_by)}.'
  )
  pairs = (
    f'Δ = mean A − mean B in {unit} (over shared seeds when paired); 95% CI of the '
    f'difference test (paired t when paired, else Welch); 90% CI and TOST against the '
    f'margin ±{out.margin:g} {unit}; equivalent: Holm-adjusted TOST p < '
    f'{inference.ALPHA:g} (raw decision in brackets when it differs); p-values raw (Holm '
    f'over the {stats.family_size(pairs)} comparison(s) tested; '
    'identical arithmetic is not tested); '
    f'seeds (pairs when paired) for 80% power, α = {inference.ALPHA:g}, at Δ = margin / for '
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
  """The 95% interval of an gap.Estimate, signed."""
  return interval(e.ci_low, e.ci_high)


def ci90(t):
  """The 90% interval of an gap.Tost, signed."""
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
  f'{inference.MIN_CI_DF:g} df (the upper bound would exceed 39× the estimate).'
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
      ci = (
        'none: estimate truncated at 0'
        if r['truncated'] or not r['estimate'] > 0
        else f'none: df {r["ci_df"]:.2g} < {inference.MIN_CI_DF:g} (more seeds needed)'
        if not np.isfinite(r['ci_low'])
        else f'[{num(r["ci_low"], 3)}, {num(r["ci_high"], 3)}] (df {r["ci_df"]:.2g})'
      )
      out.append(row | {'95% CI of the variance': ci, 'note': truncation(r, unit)})
  return out


NOT_RECORDED = 'not recorded'


def facts(runs, *columns):
  """The distinct recorded values of the first of `columns` the runs have."""
  for col in columns:
    text = inputs.distinct(runs[col]) if col in runs else None
    if text is not None:
      return text
  return NOT_RECORDED


def rank_bound(r):
  """(smallest p the rank test can give, 'n seeds') when only the rank test kept a row from
  'different' (its t-test Holm p < α and 95% CI excluding 0), else None."""
  shown = r['test_p_holm'] < inference.ALPHA and (r['ci95_low'] > 0 or r['ci95_high'] < 0)
  if r['different'] or not shown or not r['rank_p_holm'] >= inference.ALPHA:
    return None
  sizes = (r['n_pairs'],) if r['paired'] else (r['n_a'], r['n_b'])
  return inference.rank_floor(*sizes), ' + '.join(str(int(n)) for n in sizes) + ' seeds'


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
  if bound and bound[0] >= inference.ALPHA:
    return f'inconclusive: the rank test cannot reach α = {inference.ALPHA:g} at {bound[1]}'
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
      '–'
      if half is None
      else 'within'
      if abs(r['diff']) - half <= inference.RESOLUTION
      else 'beyond'
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
    why = f'{tost} < {inference.ALPHA:g}: the difference lies within ±{margin:g} {unit} ({ci90})'
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
      f'{shown} < {inference.ALPHA:g} and its {ci95} excludes 0{also}; equivalence within '
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
      f'below {inference.ALPHA:g}'
    )
  if bound is None:
    return f'neither shown: {tost}; {shown}; {rank}; {where}'
  rule = f'cannot reach α = {inference.ALPHA:g} at {bound[1]} (its smallest two-sided p is '
  rule = rule + f'{bound[0]:.3g})' if bound[0] >= inference.ALPHA else 'is not below α after Holm'
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
      name = (
        f'{r["platform"]}: {r["label"]} − reference' if several else f'{r["label"]} − reference'
      )
    what = 'pairs' if r['paired'] else 'seeds per arm'
    sd = 'sd of the per-seed differences' if r['paired'] else 'pooled sd'
    power = (
      ''
      if r['verdict'] == 'identical arithmetic'
      else f' Power (estimated from n = {r["power_from"]}; {sd} {num(r["power_sd"])} {unit}; '
      f'α = {inference.ALPHA:g}): {num(r["power_diff"])} to detect a true Δ of '
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
    f'decisions at α = {inference.ALPHA:g}, p-values Holm-adjusted over the '
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
    {
      'arm': r['arm'],
      'seed': str(r['seed']),
      'runs': str(r['n_runs']),
      'values': r['values'],
      'mean used': num(r['mean']),
      'identical': 'yes' if r['identical'] else 'no',
    }
    for _, r in out.replicates.iterrows()
  ]
  return parts + [
    ('Design of each comparison', '', design),
    ('Repeated seeds (replicates averaged; their spread is the within-seed sd)', '', reps),
    (
      'Runs excluded',
      '',
      [{'run': r['run'], 'reason': r['reason']} for _, r in out.excluded.iterrows()],
    ),
  ]


def render(out, fmt):
  """The whole report as one string."""
  from analysis import answer  # the first page's words (answer.py builds on these tables)

  if fmt == 'latex':
    split = variance_table(out)
    extra = (
      '' if split is None else latex(split, VARIANCE_CAPTION.format(unit=out.unit), 'tab:variance')
    )
    arms = latex(display_arms(out), captions(out, judged(out))[0], 'tab:arms')
    unit, parts = out.unit, []
    att = out.attribution
    for d in att.decomposition if att else []:
      parts.append(
        latex(
          component_rows(att.gap, d.gap, unit, d.margin),
          f'{d.gap} decomposition at ±{d.margin:g} {unit}: {d.verdict}. {share_line(d)}.',
          label='tab:gap-' + '-'.join(d.gap.replace(' - ', ' ').split()),
        )
      )
    table = judged(out)
    if table is not None and not table.empty:
      parts.append(
        latex(
          contrast_rows(out, table),
          f'Each arm minus the reference arm ({unit}), 95% and 90% CIs; verdicts '
          f'Holm-adjusted over the {stats.family_size(table)} contrasts tested, '
          f'margin ±{out.margin:g} {unit}.',
          label='tab:contrasts',
        )
      )
    rows = [
      {
        'platform': p,
        'device': f.device_kind or NOT_RECORDED,
        **{k: v or '–' for k, v in f.versions.items()},
      }
      for p, f in out.software.platforms.items()
    ]
    if rows:
      parts.append(latex(rows, 'Platforms and library versions of the runs.', label='tab:software'))
    return ''.join(parts) + arms + extra
  parts = [
    f'# {title(out)}\n',
    '\n## Answer\n\n',
    '\n'.join(answer.answer_lines(out) + answer.excluded_lines(out)) + '\n',
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
