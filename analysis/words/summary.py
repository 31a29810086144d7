"""The one-page answer that opens the report (Markdown), and the booktabs tables a paper can
\\input (LaTeX): the question, the platforms and their software (version differences flagged as
a confound), the gap decomposition when there are two platforms, the declared contrasts against
the noise floor and the margin with one verdict each. Numbers from analysis/numbers/analyse.py.
Reference: docs/statistics.md "Report and figures".
"""

import pandas as pd

from analysis import attribution, declaration, inputs, stats
from analysis.inputs import seed_text
from analysis.words import answer_sentence, attribution_text, tables, variance_text
from analysis.words.attribution_text import interval, signed

NOT_RECORDED = 'not recorded'


def facts(runs, *columns):
  """The distinct recorded values (inputs.distinct) of the first of `columns` the table has values
  in."""
  for col in columns:
    text = inputs.distinct(runs[col]) if col in runs else None
    if text is not None:
      return text
  return NOT_RECORDED


def setting(runs):
  """'digits, resnet18 width 0.25, 4 epochs, 8 px': the recorded facts of the runs, those
  recorded."""
  parts = [
    facts(runs, 'config.data.name', 'data.name'),
    f'{facts(runs, "config.model.name")} width {facts(runs, "config.model.width")}',
    f'{facts(runs, "config.num_epochs")} epochs',
    f'{facts(runs, "config.data.image_size", "data.image_size")} px',
  ]
  return ', '.join(p for p in parts if NOT_RECORDED not in p)


def compared(out):
  """[(a, b)] of the platform pairs the study answers: its decomposition's (the declared compare,
  --compare, or every pair), else every pair of its platforms (attribution.default_pairs)."""
  att = out.attribution
  if att and att.decomposition:
    return [tuple(d.platforms) for d in att.decomposition]
  return attribution.default_pairs(out.software.platforms)


def question(out):
  """What the study asks, from its platform pairs (the first is the question) and runs."""
  platforms = sorted(out.software.platforms)
  metric = out.metric.rsplit('.', 1)[-1].replace('_', ' ')
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
  what = ', '.join(
    p
    for p in (
      setting(out.runs),
      f'{arms} arms',
      f'{n[0]}{"–" + str(n[-1]) if len(n) > 1 else ""} seeds per arm',
    )
    if p
  )
  return (
    f'**Question.** {ask} ({what}.) Equivalence margin ±{out.margin:g} {out.unit}: '
    f'{out.margin_reason}.'
  )


def software_lines(out):
  """One line per platform (device, versions) and the confound line when versions differ."""
  info = out.software
  lines = []
  for platform, recorded in info.platforms.items():
    versions = ', '.join(f'{p} {v}' for p, v in recorded.versions.items() if v)
    devices = f' × {recorded.devices}' if recorded.devices else ''
    cpu = ', '.join(
      f'{f} {recorded.cpu[f]}'
      for f in ('cpu_model', 'cpu_isa', 'xla_cpu_isa')
      if recorded.cpu.get(f)
    )
    lines.append(
      f'- {platform}: {recorded.device_kind or NOT_RECORDED}{devices}'
      f'{f" ({cpu})" if cpu else ""}; {versions or "versions not recorded"}'
    )
  recorded = any(v for f in info.platforms.values() for v in f.versions.values())
  if info.confounds:
    lines.append(
      f'- **Confound:** {", ".join(info.confounds)} differ between the platforms; the '
      'platform gap and its residual include whatever those versions change.'
    )
  elif len(info.platforms) > 1 and recorded:
    lines.append('- The platforms ran the same recorded library versions.')
  elif len(info.platforms) > 1:
    lines.append(
      '- Library versions: not recorded, so whether the platforms ran the same software is unknown.'
    )
  return ["**Platforms and software** (from the runs' records):", *lines]


def gap_lines(out):
  """The decomposition of each platform gap (analysis/words/attribution_text.py's words)."""
  att = out.attribution
  if not att:
    return []
  if not att.decomposition:
    return [f'**Platform gap:** {att.gap_note}.', '']
  lines = [
    '**Platform gap** (per seed: native gap G = fid_A − fid_B + N + P, numerics part N, '
    f'residual R = G − N; mean over seeds with a t-interval; α = {stats.ALPHA:g}). '
    + attribution_text.pairs_line(att),
    '',
  ]
  for d in att.decomposition:
    lines += attribution_text.decomposition_lines(d, att.gap, out.unit) + ['']
  return lines


# Without a declaration every pair is tested; beyond this many the answer gives their counts.
MAX_UNDECLARED_ROWS = 12


def contrast_verdict(r, margin):
  """The verdict in a few words, from a contrast row: 'within margin (a difference shown)',
  'equivalent' (with the raw 95% CI's word where it excludes 0 and Holm does not), 'different',
  'identical arithmetic (not tested)' or 'inconclusive: …'."""
  if r['verdict'] == 'equivalent' and (r['ci95_low'] > 0 or r['ci95_high'] < 0):
    return 'equivalent (its 95% CI excludes 0 before Holm, not after)'
  if r['verdict'] != 'inconclusive':
    return r['verdict'] + {
      'identical arithmetic': ' (not tested)',
      'within margin': ' (a difference shown)',
    }.get(r['verdict'], '')
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
    floor = '–' if half is None else 'within' if abs(r['diff']) < half else 'beyond'
    rows.append(
      {
        **({'platform': r['platform']} if several else {}),
        'arm − reference' if 'label' in r else 'A − B': r['label']
        if 'label' in r
        else f'{r["arm_a"]} − {r["arm_b"]}',
        f'Δ ({out.unit})': signed(r['diff']),
        '95% CI': interval(r['ci95_low'], r['ci95_high']),
        '90% CI': interval(r['ci90_low'], r['ci90_high']),
        'noise floor': floor,
        'verdict (Holm)': contrast_verdict(r, out.margin),
      }
    )
  return rows


def contrast_lines(out):
  """The declared contrasts (or every pair without a declaration) with their verdicts."""
  table = out.contrasts if out.contrasts is not None else out.pairs
  unit, m = out.unit, out.margin
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
  if not ref and len(table) > MAX_UNDECLARED_ROWS:  # every pair of many arms: counts, not a page
    counts = table['verdict'].value_counts()
    said = ', '.join(f'{counts.get(v, 0)} {v}' for v in stats.VERDICTS[1:])
    return [
      f'{rule} {said}; every pair is in "Comparisons: every test" below. Declare the '
      "study's contrasts (get_study() in the config file, or --study FILE) to have them "
      'answered here.'
    ]
  return [rule, '', tables.markdown(contrast_rows(out, table)).rstrip('\n')]


def seeds_used(d, declared):
  """'seeds 0–5' of a decomposition, or 'seeds 0 1 2 4 5 (5 of the 6 declared: 3 lacks a cell)'."""
  used = [str(s) for s in d.seed_list]
  text = f'seeds {seed_text(pd.Series(d.seed_list))}'
  if declared and set(map(str, declared)) - set(used):
    left = [str(s) for s in declared if str(s) not in used]
    text += (
      f' ({len(used)} of the {len(declared)} declared: {", ".join(left)} '
      f'{"lacks" if len(left) == 1 else "lack"} a cell of the gap)'
    )
  return text


def headline(out):
  """'gpu − cpu: no gap (G +0.26 [-0.22, +0.75] pp, seeds 0–5); 13 contrasts: 13 equivalent' of one
  analysis: each pair's verdict with the seeds its decomposition used."""
  parts = []
  declared = out.scope.declared_seeds if out.scope else None
  for d in out.attribution.decomposition if out.attribution else []:
    parts.append(
      f'{d.gap.replace(" - ", " − ")}: **{d.verdict}** (G {signed(d.G.estimate)} '
      f'{interval(d.G.ci_low, d.G.ci_high)} {out.unit}, {seeds_used(d, declared)})'
    )
  table = out.contrasts if out.contrasts is not None else out.pairs
  if table is not None and not table.empty:
    seen = table['verdict'].value_counts()
    parts.append(
      f'{stats.family_size(table)} contrasts tested: '
      + ', '.join(f'{seen[v]} {v}' for v in stats.VERDICTS[1:] if v in seen)
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
  if out.confirmatory is not None:
    conf = out.confirmatory
    pairs = conf.attribution.decomposition if conf.attribution else []
    which = (
      f' and platform pairs {declaration.pairs_text([d.platforms for d in pairs])}' if pairs else ''
    )
    lines.append(
      f'**Confirmatory answer** (the declared seeds at the declared ±{conf.margin:g} '
      f'{out.unit}{which}): {headline(conf)}. The rest of this page is exploratory.'
    )
  elif sc.declared_seeds is None:
    lines.append('No confirmatory answer: the study declares no seeds to re-analyse.')
  else:
    lines.append('No confirmatory answer: the declared seeds were not all run.')
  return [' '.join(lines), '']


def answer_lines(out):
  """The one-page answer (Markdown lines) of an analysis.numbers.result.Analysis."""
  agreement = [] if not out.agreement else ['', out.agreement.summary]
  split = variance_text.first_page_line(out.agreement, out.unit, stats.arm_short_labels(out))
  return [
    question(out),
    '',
    answer_sentence.sentence(out),
    '',
    *scope_lines(out),
    *software_lines(out),
    '',
    *gap_lines(out),
    *contrast_lines(out),
    *agreement,
    *(['', *split] if split else []),
  ]


def latex_tables(out):
  """Booktabs tables a paper can \\input: gap decomposition, contrasts, software."""
  unit, parts = out.unit, []
  att = out.attribution
  for d in att.decomposition if att else []:
    parts.append(
      tables.latex(
        attribution_text.component_rows(att.gap, d.gap, unit, d.margin),
        f'{d.gap} decomposition at ±{d.margin:g} {unit}: {d.verdict}. '
        f'{attribution_text.share_line(d)}.',
        label='tab:gap-' + '-'.join(d.gap.replace(' - ', ' ').split()),
      )
    )
  table = out.contrasts if out.contrasts is not None else out.pairs
  if table is not None and not table.empty:
    parts.append(
      tables.latex(
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
    parts.append(
      tables.latex(rows, 'Platforms and library versions of the runs.', label='tab:software')
    )
  return ''.join(parts)
