"""The words of analysis.numbers.attribution: its Markdown report, and the platform gap's
decomposition (table, verdict and why, share explained, seeds needed) that
analysis/words/report.py's answer reuses. Numbers and verdict categories come from
analysis/numbers/attribution.py and analysis/numbers/gap.py.
Reference: docs/statistics.md "Report and figures".
"""

import numpy as np
import pandas as pd

from analysis import attribution, stats
from analysis.inputs import seed_text
from analysis.words import tables
from analysis.words.tables import num, pval

UNITS = {'pp': 'pp (percentage points: accuracy x 100)'}


def signed(x):
  return '–' if x != x else f'{x:+.2f}'


def interval(low, high):
  return '' if low != low else f'[{signed(low)}, {signed(high)}]'


def ci(r, low='ci_low', high='ci_high'):
  return f'[{num(r[low])}, {num(r[high])}]'


def component_rows(table, gap_label, unit, margin):
  """Every component of one gap (analysis/numbers/gap.py's table) as rows of strings: estimate,
  95% CI over seeds, paired-t p; G and R with their 90% CI and TOST; a component not estimable says
  why."""
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


def numerics_state(d):
  n = interval(d.N.ci_low, d.N.ci_high)
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


def interaction_state(d):
  """The interaction N_A − N_B in words when its 95% CI excludes 0, else ''."""
  if not d.flags.interaction_shown:
    return ''
  a, b = d.platforms
  return (
    f'the numerics part differs between the platforms (N_A − N_B '
    f'{signed(d.N_interaction.estimate)} '
    f'{interval(d.N_interaction.ci_low, d.N_interaction.ci_high)}: '
    f'{signed(d.N_A.estimate)} on {a}, {signed(d.N_B.estimate)} on {b}; N is their mean)'
  )


def carriers(d):
  """What carries the residual R = fid_A − fid_B + P, in words: each part whose 95% CI excludes 0
  (the emulation's fidelity on A or B, the platforms under the same emulated arithmetic, with the
  interaction where P differs between the two platforms' arithmetic), else the largest part, not
  shown."""
  (a, b), (ea, eb) = d.platforms, d.profiles
  parts = (
    ('fid_A', 1, f"{ea} not reproducing {a}'s native arithmetic on {a} (fid_A"),
    ('fid_B', -1, f"{eb} not reproducing {b}'s native arithmetic on {b} (−fid_B"),
    ('P', 1, 'the platforms under the same emulated arithmetic (P'),
  )

  def text(key, sign, name):
    c = getattr(d, key)
    return (
      f'{name} {signed(sign * c.estimate)} '
      f'{interval(*sorted([sign * c.ci_low, sign * c.ci_high]))})'
    )

  def known(key):
    return getattr(d, key).estimate == getattr(d, key).estimate

  found = [
    text(*p)
    for p in parts
    if known(p[0]) and attribution.shown(getattr(d, p[0]).ci_low, getattr(d, p[0]).ci_high)
  ]
  if found:
    return 'carried by ' + ' and '.join(found)
  if not any(known(p[0]) for p in parts):
    return ''
  key, sign, name = max(
    (p for p in parts if known(p[0])), key=lambda p: abs(getattr(d, p[0]).estimate)
  )
  return f'no part of it is shown; the largest is {text(key, sign, name)}'


def residual_state(d, unit):
  m = d.margin
  carried = carriers(d)
  if d.flags.residual_equivalent:
    return (
      f'the residual lies within ±{m:g} {unit} '
      f'(90% CI {interval(d.R_tost.ci90_low, d.R_tost.ci90_high)}, '
      f'TOST p {pval(d.R_tost.p)})'
    )
  if d.flags.residual_shown:
    return f'a residual remains (95% CI {interval(d.R.ci_low, d.R.ci_high)} excludes 0)' + (
      f', {carried}' if carried else ''
    )
  if not m:
    return 'the residual cannot be shown within a margin (none given)'
  return (
    f'the residual is neither shown nor within ±{m:g} {unit} (90% CI '
    f'{interval(d.R_tost.ci90_low, d.R_tost.ci90_high)})' + (f'; {carried}' if carried else '')
  )


def share_state(d):
  if d.flags.share_reaches:
    return f"the share's lower 95% bound reaches the minimum {d.min_share:g}"
  return f"the share's lower 95% bound is below the minimum {d.min_share:g}"


def holm_text(d):
  """' (Holm over the 3 pairs compared)' for several pairs, '' for one."""
  k = d.pairs_compared
  return f', Holm over the {k} pairs compared' if k > 1 else ''


def rank_text(d):
  """The signed-rank test beside the t-interval: its p and the seeds' signs."""
  k = d.pairs_compared
  p = pval(d.G_signed_rank_p_holm if k > 1 else d.G_signed_rank_p)
  can = (
    ''
    if d.G_signed_rank_attainable * k < stats.ALPHA
    else f'; at {d.seeds} seeds it cannot reach {stats.ALPHA:g}'
  )
  return (
    f'exact signed-rank p {p}{holm_text(d)}, {d.G_seeds_positive} of {d.seeds} '
    f'seeds above 0 and {d.G_seeds_negative} below{can}'
  )


def gap_state(d, unit):
  """Whether the gap is shown (paired t, with its Holm p over several pairs) and within ±m."""
  m, k = d.margin, d.pairs_compared
  g90 = interval(d.G_tost.ci90_low, d.G_tost.ci90_high)
  g95 = interval(d.G.ci_low, d.G.ci_high)
  holm = (
    f'; paired-t p {pval(d.G_p_holm)}{holm_text(d)}'
    if k > 1
    else ' includes 0'
    if not d.flags.gap_shown
    else ' excludes 0'
  )
  shown = f'shown (95% CI {g95}{holm})'
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
  """Why the decomposition `d` (analysis/attribution.py judge_family) got its verdict, in
  one sentence: the gap's tests (t, signed rank, TOST), the split, what carries the residual, the
  interaction and the numerics part's platforms."""
  text = gap_state(d, unit)
  if d.verdict == 'tests disagree' or d.flags.rank_shown != d.flags.gap_shown:
    text += f'; {rank_text(d)}'
  if d.verdict == 'tests disagree':
    return text + ': the t-interval and the signed-rank test disagree on whether there is a gap'
  if d.verdict == 'gap within margin':
    return text + ': a real gap, smaller than the margin'
  if d.verdict == 'no gap' or not d.flags.gap_shown:
    return text
  text += f'; {numerics_state(d)}'
  if d.flags.numerics_shown:
    text += f'; {share_state(d)}'
  text += f'; {residual_state(d, unit)}'
  inter = interaction_state(d)
  text += f'; {inter}' if inter else ''
  return text + (f' (open: {d.open})' if d.open else '')


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


def seeds_line(d, unit):
  """The seeds (per arm) each part of a decisive answer needs at the observed per-seed sds, each at
  the margin (the smallest effect of interest); without a margin, why none is given."""
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
  """The mixed model's G, N and R over the same cells with the estimate's own definitions (a named
  cross-check, not the estimator); a key it cannot define the same way says so."""
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
    tables.markdown(component_rows(table, d.gap, unit, d.margin)).rstrip('\n'),
    '',
    f'**{d.gap.replace(" - ", " − ")}: {d.verdict}** — {why(d, unit)}.',
    f'Signed-rank p of the gap {pval(d.G_signed_rank_p)} ({d.G_signed_rank_method}); '
    f'd_z {num(d.G_d_z)}; seeds used {d.seeds} ({seeds}).',
    f'{share_line(d)}; {seeds_line(d, unit)}.',
    f'{cross_check_line(d, unit)}.',
  ]


def noise_text(out):
  """The noise floor in one sentence, each platform's number after the definition, or why there
  is none."""
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


def render(out):
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
    tables.markdown(
      [
        {
          'term': labels.get(r['term'], r['term']),
          f'estimate ({u})': num(r['estimate']),
          '95% CI': ci(r),
          'p': pval(r['p']),
          'abs. estimate / smallest noise half-width': ratio(r['estimate']),
        }
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
      tables.markdown(
        [
          {
            'arm': r['arm'],
            f'minus reference arm ({u})': num(r['estimate']),
            '95% CI': ci(r),
            'p': pval(r['p']),
          }
          for _, r in out.arms.iterrows()
        ]
      )
    )
  lines += [
    '## Excluded runs',
    '',
    tables.markdown([{'run': r['run'], 'reason': r['reason']} for _, r in out.excluded.iterrows()]),
  ]
  return '\n'.join(lines)


def pairs_line(out):
  """Which platform pairs are decomposed, where they came from and how they enter the tests."""
  pairs = ', '.join(d.gap.replace(' - ', ' − ') for d in out.decomposition)
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
  """How the gap was measured (pairs, native arm, emulation per platform, the per-seed
  estimator), or why not."""
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
