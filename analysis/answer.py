"""The study's answer in words: why each platform gap got its verdict, the report's first page,
and the attribution's report (attribution.md) (docs/statistics.md)."""

import numpy as np
import pandas as pd

from analysis import agreement, declaration, gap, inference, report, stats
from analysis.inputs import seed_text
from analysis.report import ci90, ci95, interval, markdown, num, pair_name, pval, signed

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

  found = [text(*p) for p in parts if gap.shown(p[0].ci_low, p[0].ci_high)]
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
      if d.G_signed_rank_attainable * k < inference.ALPHA
      else f'; at {d.seeds} seeds it cannot reach {inference.ALPHA:g}'
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
    f'seeds for 80% power (α = {inference.ALPHA:g}, paired t at the observed sd of each '
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
    markdown(report.component_rows(table, d.gap, unit, d.margin)).rstrip('\n'),
    '',
    f'**{pair_name(d)}: {d.verdict}** — {why(d, unit)}.',
    f'Signed-rank p of the gap {pval(d.G_signed_rank_p)} ({d.G_signed_rank_method}); '
    f'd_z {num(d.G_d_z)}; seeds used {d.seeds} ({seeds}).',
    f'{report.share_line(d)}; {seeds_line(d, unit)}.',
    f'{cross_check_line(d, unit)}.',
  ]


def noise_text(out):
  """The noise floor in one sentence, each platform's number after the definition."""
  if not out.noise:
    return 'noise floor unavailable: no --noise-arm given, or it shares < 2 seeds with its base arm'
  floors = list(out.noise.items())
  descriptions = {f.what for _, f in floors}
  what = (
    next(iter(descriptions)) if len(descriptions) == 1 else 'the noise arm − the arm it perturbs'
  )
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

  lines.append(
    markdown(
      [
        {'term': labels.get(r['term'], r['term']), f'estimate ({u})': num(r['estimate'])}
        | {'95% CI': report.ci(r), 'p': pval(r['p'])}
        | {'abs. estimate / smallest noise half-width': ratio(r['estimate'])}
        for _, r in out.terms.iterrows()
      ]
    )
  )
  margin = (
    f'±{out.margin:g} {u}' + (f' ({out.margin_reason})' if out.margin_reason else '')
    if out.margin
    else 'none given'
  )
  lines += ['## Platform gap', '', gap_note(out), f'equivalence margin: {margin}', '']
  for d in out.decomposition:
    lines += decomposition_lines(d, out.gap, u) + ['']
  if out.arms is not None:
    lines.append(
      markdown(
        [
          {'arm': r['arm'], f'minus reference arm ({u})': num(r['estimate'])}
          | {'95% CI': report.ci(r), 'p': pval(r['p'])}
          for _, r in out.arms.iterrows()
        ]
      )
    )
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
  return f'Platform pairs (G = A − B): {pairs}, {source}{holm}{left}.'


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
  table, metric = report.judged(out), metric_name(out)
  if table is None or table.empty:
    return ''
  if out.contrasts is None:
    return (
      f'{len(out.pairs)} pairs of arms compared on {metric} (no declared contrasts, Holm over '
      f'{stats.family_size(out.pairs)}): {report.counts(out.pairs)}'
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
    parts.append(f'{show(by["different"])} changed {metric} (a difference shown, not within {m})')
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
  platforms = sorted(out.software.platforms)
  where = f'on {listed(platforms)}, ' if platforms else ''
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
    report.facts(runs, 'config.data.name', 'data.name'),
    f'{report.facts(runs, "config.model.name")} width {report.facts(runs, "config.model.width")}',
    f'{report.facts(runs, "config.num_epochs")} epochs',
    f'{report.facts(runs, "config.data.image_size", "data.image_size")} px',
  ]
  return ', '.join(p for p in parts if report.NOT_RECORDED not in p)


def compared(out):
  """[(a, b)] of the platform pairs the study answers: its decomposition's."""
  att = out.attribution
  if att and att.decomposition:
    return [tuple(d.platforms) for d in att.decomposition]
  return gap.default_pairs(out.software.platforms)


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


# Without a declaration every pair is tested; beyond this many the answer gives their counts.
MAX_UNDECLARED_ROWS = 12


def contrast_lines(out):
  """The declared contrasts (or every pair without a declaration) with their verdicts."""
  table, unit, m = report.judged(out), out.unit, out.margin
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
    f'{inference.ALPHA:g} (90% CI inside ±{m:g}); different = Holm p < {inference.ALPHA:g} and '
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
  return [rule, '', markdown(report.contrast_rows(out, table)).rstrip('\n')]


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
  table = report.judged(out)
  if table is not None and not table.empty:
    parts.append(
      f'{stats.family_size(table)} contrasts tested: {report.counts(table, stats.VERDICTS[1:])}'
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
      f'- {platform}: {recorded.device_kind or report.NOT_RECORDED}{devices}'
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
      parts = [
        f'{r["component"]} {num(r["share_pct"], 0)} % (sd {num(r["sd"], 2)} {unit}'
        + (', truncated at 0' if r['truncated'] else '')
        + ')'
        for _, r in group.iterrows()
      ]
      split.append(
        f'**Variance between runs** of {labels.get(arm, arm)} ({report.variance_design(group)}): '
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
      f'residual R = G − N; mean over seeds with a t-interval; α = {inference.ALPHA:g}). '
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
    '',
    *gap,
    *contrast_lines(out),
    *agreement,
    *(['', *split] if split else []),
  ]


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
