"""The words of the statistics report: the one-page answer first (analysis/words/summary.py), then
the setup, why each comparison got its verdict with its power, the arms, and the rest (design,
replicates, exclusions). Numbers and verdict categories come from analysis/numbers/stats.py (a
pair's verdict: equivalent / different / inconclusive, see there) and analysis/numbers/analyse.py.

  text = render(out, 'md')        # or 'latex': the booktabs tables only, for \\input
Reference: docs/statistics.md "Report and figures".
"""

from analysis import stats
from analysis.words import summary, tables, variance_text
from analysis.words.attribution_text import signed
from analysis.words.summary import NOT_RECORDED, facts
from analysis.words.tables import num, pval


def verdict_why(r, margin, unit, m):
  """Why pair_table/contrast row `r` got its verdict; m = the number of pairs Holm adjusts over."""
  if r['verdict'] == 'identical arithmetic':
    return (
      "the two arms ran the same effective arithmetic on one platform (their records' "
      'numerics.effective fields are equal) and every paired difference is exactly 0: '
      'not tested, outside the Holm family'
    )
  holm = f'Holm over {m} pair{"s" if m > 1 else ""}'
  tost = f'TOST p = {pval(r["tost_p_holm"])} ({holm}; raw {pval(r["tost_p"])})'
  test = f'{r["test"]} p = {pval(r["test_p_holm"])} ({holm}; raw {pval(r["test_p"])})'
  ci90 = f'90% CI [{signed(r["ci90_low"])}, {signed(r["ci90_high"])}] {unit}'
  ci95 = f'95% CI [{signed(r["ci95_low"])}, {signed(r["ci95_high"])}] {unit}'
  if r['equivalent']:
    why = f'{tost} < {stats.ALPHA:g}: the difference lies within ±{margin:g} {unit} ({ci90})'
    if r['different']:
      why += f'; a nonzero difference is also detected ({test}, {ci95}), inside the margin'
    return why
  rank = f'{r["rank_test"]} p = {pval(r["rank_p_holm"])} ({holm}; raw {pval(r["rank_p"])})'
  if r['different']:
    also = (
      f'; on the {r["lattice"]:.3g}-{unit} lattice of the metric the {rank} agrees'
      if r['lattice'] == r['lattice'] and r['lattice'] is not None
      else ''
    )
    return (
      f'{test} < {stats.ALPHA:g} and its {ci95} excludes 0{also}; equivalence within '
      f'±{margin:g} {unit} not shown ({tost})'
    )
  low, high = r['ci90_low'] <= -margin, r['ci90_high'] >= margin
  if low and high:
    where = f'the {ci90} is wider than the margin ±{margin:g} {unit} on both sides'
  elif low or high:
    where = f'the {ci90} extends past {"−" if low else "+"}{margin:g} {unit}'
  else:
    where = (
      f'the {ci90} lies inside ±{margin:g} {unit}, but the Holm-adjusted TOST p is not '
      f'below {stats.ALPHA:g}'
    )
  return f'neither shown: {tost}; {test}; {rank}; {where}'


def power_line(r, margin, unit):
  """What the design used could detect, and the seeds 80% power needs, from this pair's data."""
  what = 'pairs' if r['paired'] else 'seeds per arm'
  sd = 'sd of the per-seed differences' if r['paired'] else 'pooled sd'
  return (
    f'Power (estimated from n = {r["power_from"]}; {sd} {num(r["power_sd"])} {unit}; '
    f'α = {stats.ALPHA:g}): {num(r["power_diff"])} to detect a true Δ of ±{margin:g} {unit}, '
    f'{num(r["power_equiv"])} to show equivalence when the true Δ is 0; 80% power needs '
    f'{r["n80_diff"]} / {r["n80_equiv"]} {what}'
  )


def judged(out):
  """(the table the report judges: declared contrasts, else every pair; its row names)."""
  if out.contrasts is not None:
    table = out.contrasts
    several = table['platform'].nunique() > 1 if not table.empty else False
    names = [
      f'{r["platform"]}: {r["label"]} − reference' if several else f'{r["label"]} − reference'
      for _, r in table.iterrows()
    ]
    return table, names
  return out.pairs, [f'{r["arm_a"]} vs {r["arm_b"]}' for _, r in out.pairs.iterrows()]


def verdict_lines(out):
  """One line per judged comparison: the verdict in bold, Δ, why, the design, the power."""
  unit = out.unit
  table, names = judged(out)
  tested = stats.family_size(table)
  lines = []
  for name, (_, r) in zip(names, table.iterrows(), strict=True):
    power = '' if r['verdict'] == 'identical arithmetic' else f' {power_line(r, out.margin, unit)}.'
    lines.append(
      f'- **{name}: {r["verdict"]}.** Δ = {signed(r["diff"])} {unit}. Why: '
      f'{verdict_why(r, out.margin, unit, tested)}. Design: {r["design"]}.{power}'
    )
  return lines or ['- no pair of arms with n ≥ 2 each: nothing to compare']


def sizes(out):
  """'train 1437 / test 360 images; one test image = 0.278 pp' from the data.* columns."""
  runs = out.runs
  train, test = facts(runs, 'data.train_size'), facts(runs, 'data.test_size')
  text = f'train {train} / test {test} images'
  try:
    one = 100.0 / float(test)
  except ValueError:
    return text
  return text + (f'; one test image = {one:.3g} pp' if out.scale == 100 else '')


def seed_lines(out):
  """The seeds: once when every arm has the same ones, else per arm."""
  if not out.seeded:
    return ['seeds: no seed column: every row is its own run, so no pair is paired']
  per_arm = dict(zip(out.arms['arm'], out.arms['seeds'], strict=True))
  if len(set(per_arm.values())) == 1:
    return [f'seeds (every arm): {next(iter(per_arm.values()))}']
  return [f'seeds of {arm}: {seeds}' for arm, seeds in per_arm.items()]


def title(out):
  """'Final test accuracy by arm: 3 arms, 5 seeds each (digits)' ('8 arms on 2 platforms (cpu,
  gpu)' when the declared arms ran on several): what the report compares."""
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


def arm_fields(out):
  """'differ in profile; grouped by platform, device_kind, ...': the grouping fields, those whose
  values differ between the arms first."""

  def short(g):
    return g.rsplit('.', 1)[-1]

  table = out.arms
  differ = [short(g) for g in out.group_by if g in table and table[g].astype(str).nunique() > 1]
  grouped = f'grouped by {", ".join(short(g) for g in out.group_by)}'
  return f'differ in {", ".join(differ)}; {grouped}' if differ else grouped


def setup_lines(out):
  """The setup, one Markdown bullet each: data, sizes, training, arms, seeds, margin."""
  runs, unit, name = out.runs, out.unit, stats.arm_short_labels(out)
  arms = '; '.join(
    f'{name[r["arm"]]} ({r["n"]} seeds, {r["n_runs"]} runs)'
    if out.seeded
    else f'{name[r["arm"]]} ({r["n_runs"]} runs)'
    for _, r in out.arms.iterrows()
  )
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
  lines += [
    f'metric: {out.metric}'
    + (' (in %)' if out.scale == 100 else '')
    + (f'; runs read from {out.source}' if out.source else ''),
    f'arms ({arm_fields(out)}): {arms}',
    *seed_lines(out),
    f'equivalence margin: ±{out.margin:g} {unit} ({out.margin_reason})',
    f'decisions at α = {stats.ALPHA:g}, p-values Holm-adjusted over the '
    f'{stats.family_size(judged(out)[0])} comparisons tested (identical arithmetic is reported, '
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
  arms_cap, pairs_cap = tables.captions(out, judged(out)[0])
  table = labelled(out, judged(out)[0])
  parts = [
    ('Arms', arms_cap, tables.display_arms(out)),
    ('Comparisons: every test', pairs_cap, tables.display_pairs(table, out.unit)),
  ]
  if out.contrasts is not None and not out.pairs.empty:
    parts.append(
      (
        'All pairs (--all-pairs; Holm over all pairs, not the declared family)',
        '',
        tables.display_pairs(out.pairs, out.unit),
      )
    )
  split = out.agreement.variance if out.agreement else None
  if split is not None and not split.empty:
    parts.append(
      (
        'Where the variance between runs comes from',
        variance_text.CAPTION.format(unit=out.unit),
        variance_text.rows(split, out.unit, stats.arm_short_labels(out)),
      )
    )
  return parts + [(heading, '', rows) for heading, rows in tables.detail_tables(out, table)]


def excluded_lines(out):
  """The first page's count of the runs left out, by reason (the Excluded table lists each run)."""
  excluded = out.excluded
  if excluded.empty:
    return []
  counts = excluded['reason'].value_counts()
  said = '; '.join(f'{n} {why}' for why, n in counts.head(5).items())
  more = f'; {len(counts) - 5} other reasons' if len(counts) > 5 else ''
  total = len(excluded) + len(out.runs)
  return [
    '',
    f'**Excluded:** {len(excluded)} of {total} runs ({said}{more}); each is listed under '
    '"Runs excluded" below.',
  ]


def render(out, fmt):
  """The whole report as one string. md: title, the answer (analysis/words/summary.py), setup, why
  each comparison got its verdict, then the tables. latex: the booktabs tables only. `out`: an
  analysis.numbers.result.Analysis (analysis.numbers.answer.study_analysis)."""
  if fmt == 'latex':
    arms_cap, _ = tables.captions(out, judged(out)[0])
    split = out.agreement.variance if out.agreement else None
    extra = (
      tables.latex(
        variance_text.rows(split, out.unit, stats.arm_short_labels(out)),
        variance_text.CAPTION.format(unit=out.unit),
        'tab:variance',
      )
      if split is not None and not split.empty
      else ''
    )
    return (
      summary.latex_tables(out)
      + tables.latex(tables.display_arms(out), arms_cap, 'tab:arms')
      + extra
    )
  answer_page = summary.answer_lines(out) + excluded_lines(out)
  parts = [
    f'# {title(out)}\n',
    '\n## Answer\n\n',
    '\n'.join(answer_page) + '\n',
    '\n## Setup\n\n',
    '\n'.join(setup_lines(out)) + '\n',
    '\n## Why each verdict, and its power\n\n',
    '\n'.join(verdict_lines(out)) + '\n',
  ]
  for heading, caption, rows in details(out):
    parts += [f'\n## {heading}\n\n', f'{caption}\n\n' if caption else '', tables.markdown(rows)]
  if not out.small.empty:
    parts += ['\n## Arms with n < 2 (tests skipped)\n\n', ', '.join(out.small['arm']) + '\n']
  return ''.join(parts)
