"""The words of analysis.numbers.attribution: its Markdown report, and the platform gap's decomposition
(table, verdict and why, share explained, seeds needed) that analysis/words/report.py's answer reuses.
Numbers and verdict categories come from analysis/numbers/attribution.py and analysis/numbers/gap.py.
"""

import numpy as np

from analysis.numbers import inference
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
  """Every component of one gap (analysis/numbers/gap.py's table) as rows of strings: estimate, 95% CI
  over seeds, paired-t p; G and R with their 90% CI and TOST; a component not estimable says why."""
  rows = []
  for _, r in table[table['gap'] == gap_label].iterrows():
    tost = r['key'] in ('G', 'R') and margin and r['note'] == ''
    rows.append({'component': r['component'],
                 f'estimate ({unit})': signed(r['estimate']) if r['note'] == '' else r['note'],
                 '95% CI': interval(r['ci_low'], r['ci_high']) if r['note'] == '' else '',
                 'p': pval(r['p']) if r['note'] == '' else '',
                 '90% CI': interval(r['ci90_low'], r['ci90_high']) if tost else '',
                 f'TOST p (±{margin:g})' if margin else 'TOST p':
                     pval(r['tost_p']) if tost else ''})
  return rows


def numerics_state(d):
  n = interval(d['N_ci_low'], d['N_ci_high'])
  if not d['N_estimable']:
    return 'the numerics part is not estimable from the arms run'
  if d['numerics_shown']:
    return f'the numerics part has the gap\'s sign and excludes 0 ({n})'
  if d['numerics_opposite']:
    return f'the numerics part has the opposite sign ({n})'
  return f'the numerics part\'s 95% CI {n} includes 0'


def residual_state(d, unit):
  m = d['margin']
  if d['residual_equivalent']:
    return (f'the residual lies within ±{m:g} {unit} (90% CI {interval(d["R_ci90_low"], d["R_ci90_high"])}, '
            f'TOST p {pval(d["R_tost_p"])})')
  if d['residual_shown']:
    return f'a residual remains (95% CI {interval(d["R_ci_low"], d["R_ci_high"])} excludes 0)'
  if not m:
    return 'the residual cannot be shown within a margin (none given)'
  return (f'the residual is neither shown nor within ±{m:g} {unit} (90% CI '
          f'{interval(d["R_ci90_low"], d["R_ci90_high"])})')


def share_state(d):
  if d['share_reaches']:
    return f'the share\'s lower 95% bound reaches the minimum {d["min_share"]:g}'
  return f'the share\'s lower 95% bound is below the minimum {d["min_share"]:g}'


def why(d, unit):
  """Why the decomposition `d` (analysis/numbers/gap_verdict.py judge) got its verdict, in one sentence."""
  m = d['margin']
  g90 = interval(d['G_ci90_low'], d['G_ci90_high'])
  g95 = interval(d['G_ci_low'], d['G_ci_high'])
  if d['verdict'] == 'no gap':
    return (f'the native gap is not shown (95% CI {g95} includes 0) and lies within ±{m:g} {unit} '
            f'(90% CI {g90}, TOST p {pval(d["G_tost_p"])})')
  if d['verdict'] == 'gap within margin':
    return (f'the native gap is shown (95% CI {g95} excludes 0) and lies within ±{m:g} {unit} '
            f'(90% CI {g90}, TOST p {pval(d["G_tost_p"])}): a real gap, smaller than the margin')
  if not d['gap_shown']:
    within = f' nor within ±{m:g} {unit} (90% CI {g90})' if m else ' (and no margin was given)'
    return f'the native gap is neither shown (95% CI {g95} includes 0){within}'
  text = f'the native gap is shown (95% CI {g95}); {numerics_state(d)}'
  if d['numerics_shown']:
    text += f'; {share_state(d)}'
  text += f'; {residual_state(d, unit)}'
  return text + (f' (open: {d["open"]})' if d['open'] else '')


def share_line(d):
  """The share of the gap the numerics part accounts for, with its interval and method."""
  if d['share'] != d['share']:
    return 'share of the gap explained by numerics: not estimable (no numerics part)'
  if not np.isfinite(d['share_ci_low']):
    return (f'share of the gap explained by numerics: N / G = {d["share"]:.2f}, 95% CI unbounded '
            f'({d["share_method"]}: the gap is not shown to be nonzero)')
  return (f'share of the gap explained by numerics: N / G = {d["share"]:.2f} (95% CI '
          f'[{d["share_ci_low"]:.2f}, {d["share_ci_high"]:.2f}], {d["share_method"]}; '
          f'"explained" needs the lower bound ≥ {d["min_share"]:g})')


def seeds_line(d, unit):
  """The seeds (per arm) each part of a decisive answer needs at the observed per-seed sds."""
  m = f'±{d["margin"]:g} {unit}' if d['margin'] else ''
  names = {'gap nonzero': f'gap ≠ 0 (at {signed(d["G"])})',
           'numerics part nonzero': f'numerics part ≠ 0 (at {signed(d["N"])})',
           'gap within margin': f'gap within {m} (true 0)',
           'residual within margin': f'residual within {m} (true 0)'}
  parts = [f'{names[q]} {n}' for q, n in d['seeds_needed'].items()]
  return (f'seeds for 80% power (α = {inference.ALPHA:g}, paired t at the observed sd of each '
          f'per-seed component; now {d["seeds"]}): ' + ', '.join(parts))


def cross_check_line(d, unit):
  """The mixed model's G, N and R over the same cells (a named cross-check, not the estimator)."""
  c = d['cross_check']
  if not c.get('G'):
    return 'cross-check (mixed model over the same cells): fit failed'
  parts = [f'{k} {signed(c[k]["estimate"])} {interval(c[k]["ci_low"], c[k]["ci_high"])}'
           for k in ('G', 'N', 'R') if c.get(k)]
  return (f'cross-check, {c["method"].split(" (")[0]} over the same cells (one residual variance '
          f'for every cell): ' + ', '.join(parts) + f' {unit}')


def decomposition_lines(d, table, unit):
  """Markdown lines of one gap's decomposition: table, verdict with why, share, seeds, check."""
  return [tables.markdown(component_rows(table, d['gap'], unit, d['margin'])).rstrip('\n'), '',
          f'**{d["gap"].replace(" - ", " − ")}: {d["verdict"]}** — {why(d, unit)}.',
          f'Signed-rank p of the gap {pval(d["G_signed_rank_p"])} ({d["G_signed_rank_method"]}); '
          f'd_z {num(d["G_d_z"])}; seeds used {d["seeds"]}.',
          f'{share_line(d)}; {seeds_line(d, unit)}.', f'{cross_check_line(d, unit)}.']


def noise_text(out):
  """The noise floor lines, one per platform, or why there is none."""
  if not out.noise:
    return 'noise floor unavailable: no --noise-arm given, or it shares < 2 seeds with its base arm'
  return '; '.join(f'{p}: {f["text"]}' if p else f['text'] for p, f in out.noise.items())


def render(out):
  """The attribution report as Markdown: model, method, units, the tables, the excluded runs."""
  u, labels = out.unit, out.labels or {}
  half = min((f['half'] for f in out.noise.values()), default=np.nan)
  lines = [f'# Attribution of {out.metric}' + (f' ({out.source})' if out.source else ''),
           '', f'model: {out.model}', f'method: {out.method}',
           f'runs: {out.n_runs} used, {len(out.excluded)} excluded, '
           f'{len(out.replicates)} arm/seed(s) run more than once (each run kept)',
           f'units: {UNITS.get(u, u)}; each term = difference from its factor\'s reference level '
           '(other factors fixed), 95% CI and two-sided p, no multiplicity correction',
           f'reference levels: {", ".join(f"{k}={v}" for k, v in out.reference.items())}',
           noise_text(out), '']
  ratio = lambda e: num(abs(e) / half) if half > 0 else '–'
  lines.append(tables.markdown([{'term': labels.get(r['term'], r['term']), f'estimate ({u})': num(r['estimate']),
                                '95% CI': ci(r), 'p': pval(r['p']),
                                'abs. estimate / smallest noise half-width': ratio(r['estimate'])}
                               for _, r in out.terms.iterrows()]))
  margin = (f'±{out.margin:g} {u}' + (f' ({out.margin_reason})' if out.margin_reason else '')
            if out.margin else 'none given')
  lines += ['## Platform gap', '', gap_note(out), f'equivalence margin: {margin}', '']
  for d in out.decomposition:
    lines += decomposition_lines(d, out.gap, u) + ['']
  if out.arms is not None:
    lines.append(tables.markdown([{'arm': r['arm'], f'minus reference arm ({u})':
                                  num(r['estimate']), '95% CI': ci(r), 'p': pval(r['p'])}
                                 for _, r in out.arms.iterrows()]))
  lines += ['## Excluded runs', '', tables.markdown([{'run': r['run'], 'reason': r['reason']}
                                                   for _, r in out.excluded.iterrows()])]
  return '\n'.join(lines)


def gap_note(out):
  """How the gap was measured (native arm, emulation per platform, the per-seed estimator), or why
  not."""
  if out.native is None:
    return out.gap_note
  factor, level = out.native
  return (f'native arm {factor}={level}; emulation of each platform\'s native arithmetic: '
          + ', '.join(f'{p}={q}' for p, q in out.emulation.items())
          + '. Each component is a per-seed combination of the cells (platform, '
          f'{factor}) at the other factors\' reference levels, its mean with a t-interval over '
          'seeds; G = fid_A − fid_B + N + P exactly. (The effects table above is the main-effects '
          f'model: its platform term averages different arithmetics, as {factor}={level} differs '
          'between platforms; it is not the gap.)')
