"""The words of analysis.attribution: its Markdown report, and the platform gap's decomposition
(table, verdict and why, share explained, seeds needed) that analysis/report.py's answer reuses.
Numbers and verdict categories come from analysis/attribution.py and analysis/gap.py.
"""

from analysis import inference, style
from analysis.style import num, pval

UNITS = {'pp': 'pp (percentage points: accuracy x 100)'}


def signed(x):
  return '–' if x != x else f'{x:+.2f}'


def interval(low, high):
  return '' if low != low else f'[{signed(low)}, {signed(high)}]'


def ci(r, low='ci_low', high='ci_high'):
  return f'[{num(r[low])}, {num(r[high])}]'


def component_rows(d, unit):
  """The decomposition of one gap as table rows (strings): G, N, R."""
  a, b = d['profiles']
  names = {'G': f'native gap {d["gap"].replace(" - ", " − ")}',
           'N': f'numerics part ({a} − {b})', 'R': 'platform residual'}
  rows = []
  for key, name in names.items():
    tost = key in ('G', 'R') and d['margin']
    rows.append({'component': name, f'estimate ({unit})': signed(d[key]),
                 '95% CI': interval(d[f'{key}_ci_low'], d[f'{key}_ci_high']),
                 '90% CI': interval(d[f'{key}_ci90_low'], d[f'{key}_ci90_high']) if tost else '',
                 f'TOST p (±{d["margin"]:g})' if d['margin'] else 'TOST p':
                     pval(d[f'{key}_tost_p']) if tost else ''})
  return rows


def numerics_state(d):
  if d['numerics_shown']:
    return f'the numerics part has the gap\'s sign and excludes 0 ({interval(d["N_ci_low"], d["N_ci_high"])})'
  if d['numerics_opposite']:
    return f'the numerics part has the opposite sign ({interval(d["N_ci_low"], d["N_ci_high"])})'
  return f'the numerics part\'s 95% CI {interval(d["N_ci_low"], d["N_ci_high"])} includes 0'


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


def why(d, unit):
  """Why the decomposition `d` (analysis/gap.py judge) got its verdict, in one sentence."""
  m = d['margin']
  g90 = interval(d['G_ci90_low'], d['G_ci90_high'])
  g95 = interval(d['G_ci_low'], d['G_ci_high'])
  if d['verdict'] == 'no gap':
    return (f'the native gap lies within ±{m:g} {unit} (90% CI {g90}, TOST p {pval(d["G_tost_p"])}): '
            'there is no gap beyond the margin to explain')
  if not d['gap_shown']:
    within = f' nor within ±{m:g} {unit} (90% CI {g90})' if m else ' (and no margin was given)'
    return f'the native gap is neither shown (95% CI {g95} includes 0){within}'
  return f'the native gap is shown (95% CI {g95}); {numerics_state(d)}; {residual_state(d, unit)}'


def share_line(d):
  """The share of the gap the numerics part accounts for, with its interval and method."""
  if d['share'] != d['share']:
    return 'share of the gap explained by numerics: undefined (the gap is not shown to be nonzero)'
  return (f'share of the gap explained by numerics: N / G = {d["share"]:.2f} (95% CI '
          f'[{d["share_ci_low"]:.2f}, {d["share_ci_high"]:.2f}], {d["share_method"]})')


def seeds_line(d, unit):
  """The seeds (per arm) each part of a decisive answer needs at the observed sds."""
  m = f'±{d["margin"]:g} {unit}' if d['margin'] else ''
  names = {'gap nonzero': f'gap ≠ 0 (at {signed(d["G"])})',
           'numerics part nonzero': f'numerics part ≠ 0 (at {signed(d["N"])})',
           'gap within margin': f'gap within {m} (true 0)',
           'residual within margin': f'residual within {m} (true 0)'}
  parts = [f'{names[q]} {n}' for q, n in d['seeds_needed'].items()]
  return (f'seeds per arm for 80% power (α = {inference.ALPHA:g}, per-seed sd = se × √{d["seeds"]} '
          f'of this fit; now {d["seeds"]}): ' + ', '.join(parts))


def decomposition_lines(d, unit):
  """Markdown lines of one gap's decomposition: table, verdict with why, share, seeds."""
  return [style.markdown(component_rows(d, unit)).rstrip('\n'), '',
          f'**{d["gap"].replace(" - ", " − ")}: {d["verdict"]}** — {why(d, unit)}.',
          f'{share_line(d)}; {seeds_line(d, unit)}.']


def render(out):
  """The attribution report as Markdown: model, method, units, the tables, the excluded runs."""
  u, half, labels = out['unit'], out['noise']['half'], out.get('labels') or {}
  lines = [f'# Attribution of {out["metric"]}' + (f' ({out["source"]})' if out['source'] else ''),
           '', f'model: {out["model"]}', f'method: {out["method"]}',
           f'runs: {out["n_runs"]} used, {len(out["excluded"])} excluded, '
           f'{len(out["replicates"])} arm/seed(s) run more than once (each run kept)',
           f'units: {UNITS.get(u, u)}; each term = difference from its factor\'s reference level '
           '(other factors fixed), 95% CI and two-sided p, no multiplicity correction',
           f'reference levels: {", ".join(f"{k}={v}" for k, v in out["reference"].items())}',
           out['noise']['text'], '']
  ratio = lambda e: num(abs(e) / half) if half > 0 else '–'
  lines.append(style.markdown([{'term': labels.get(r['term'], r['term']), f'estimate ({u})': num(r['estimate']),
                                '95% CI': ci(r), 'p': pval(r['p']),
                                'abs. estimate / noise half-width': ratio(r['estimate'])}
                               for _, r in out['terms'].iterrows()]))
  margin = (f'±{out["margin"]:g} {u}' + (f' ({out["margin_reason"]})' if out['margin_reason'] else '')
            if out['margin'] else 'none given')
  lines += ['## Platform gap', '', gap_note(out), f'equivalence margin: {margin}', '']
  for d in out['decomposition']:
    lines += decomposition_lines(d, u) + ['']
  if out['gap'] is not None:
    lines += ['Every component (95% CI; native gap and residual also with their TOST):', '',
              style.markdown([{'gap': r['gap'], 'component': r['component'],
                               f'estimate ({u})': num(r['estimate']), '95% CI': ci(r),
                               'p': pval(r['p'])} for _, r in out['gap'].iterrows()])]
  if out['arms'] is not None:
    lines.append(style.markdown([{'arm': r['arm'], f'minus reference arm ({u})':
                                  num(r['estimate']), '95% CI': ci(r), 'p': pval(r['p'])}
                                 for _, r in out['arms'].iterrows()]))
  lines += ['## Excluded runs', '', style.markdown([{'run': r['run'], 'reason': r['reason']}
                                                   for _, r in out['excluded'].iterrows()])]
  return '\n'.join(lines)


def gap_note(out):
  """How the gap was split (native arm, emulation per platform, the gap model), or why not."""
  if out['native'] is None:
    return out['gap_note']
  factor, level = out['native']
  return (f'native arm {factor}={level}; emulation of each platform\'s native arithmetic: '
          + ', '.join(f'{p}={q}' for p, q in out['emulation'].items())
          + f'. Gap model: {factor} crossed with platform; {out["gap_method"]}. (In the effects '
          f'table above, {factor}={level} averages the platforms\' different native arithmetics, '
          f'which also biases the platform term; --interactions platform:{factor} separates them.)')
