"""How analysis.attribution's results are shown: the Markdown report (render) and the forest plot
(plot): each term's estimate with its 95% CI, the noise floor as a band, the equivalence margin as
dashed lines and a zero line, as PDF and 300-dpi PNG in analysis/style.py's style.
"""

import numpy as np

from analysis import style

plt = style.plt
NAME = 'attribution_forest'
UNITS = {'pp': 'pp (percentage points: accuracy x 100)'}


def plot(out, out_dir, name=NAME):
  """Draw out['terms'] (top to bottom in table order); returns the two file paths."""
  style.apply()
  terms = out['terms']
  unit, half, margin = out['unit'], out['noise']['half'], out['margin']
  n = len(terms)
  fig, ax = plt.subplots(figsize=(style.WIDTH_IN * 0.7, 0.8 + 0.32 * max(n, 1)))
  y = np.arange(n)[::-1]
  if np.isfinite(half) and half > 0:
    ax.axvspan(-half, half, color='#999999', alpha=0.18, linewidth=0,
               label=f'noise floor ±{half:.2f} {unit} (95% half-width, two replicate means)')
  if margin:
    for sign in (-1, 1):
      ax.axvline(sign * margin, color='#D55E00', linestyle='--', linewidth=0.9,
                 label=f'equivalence margin ±{margin:g} {unit}' if sign > 0 else None)
  ax.axvline(0, color='#555555', linewidth=0.6)
  if n:
    est = terms['estimate'].to_numpy()
    err = [est - terms['ci_low'].to_numpy(), terms['ci_high'].to_numpy() - est]
    ax.errorbar(est, y, xerr=err, fmt='D', color='#0072B2', markersize=3.5, capsize=2.5,
                linewidth=0.9, zorder=3, label='estimate ± 95% CI')
  ax.set_yticks(y, list(terms['term']))
  ax.set_ylim(-0.7, n - 0.3)
  ax.grid(axis='y', visible=False)
  ax.grid(axis='x', color='#EEEEEE', linewidth=0.5)
  ax.set_xlabel(f'difference from the reference level ({unit})')
  ax.legend(loc='lower left', bbox_to_anchor=(0.0, 1.01), ncol=1, borderaxespad=0.0)
  return style.save(fig, out_dir, name)


def ci(r, low='ci_low', high='ci_high'):
  return f'[{style.num(r[low])}, {style.num(r[high])}]'


def tost_cells(r):
  return {'90% CI (TOST)': ci(r, 'ci90_low', 'ci90_high'), 'TOST p': style.pval(r['tost_p']),
          'verdict': r['verdict']}


def render(out):
  """The report as Markdown text: model, method, units, the tables, the excluded runs."""
  u, half = out['unit'], out['noise']['half']
  lines = [f'# Attribution of {out["metric"]}' + (f' ({out["source"]})' if out['source'] else ''),
           '', f'model: {out["model"]}', f'method: {out["method"]}',
           f'runs: {out["n_runs"]} used, {len(out["excluded"])} excluded, '
           f'{len(out["replicates"])} arm/seed(s) run more than once (each run kept)',
           f'units: {UNITS.get(u, u)}; each term = difference from its factor\'s reference level '
           '(other factors fixed), 95% CI and two-sided p, no multiplicity correction',
           f'reference levels: {", ".join(f"{k}={v}" for k, v in out["reference"].items())}',
           out['noise']['text'], '']
  ratio = lambda e: style.num(abs(e) / half) if half > 0 else '–'
  lines.append(style.markdown([{'term': r['term'], f'estimate ({u})': style.num(r['estimate']),
                                '95% CI': ci(r), 'p': style.pval(r['p']),
                                'abs. estimate / noise half-width': ratio(r['estimate'])}
                               for _, r in out['terms'].iterrows()]))
  margin = (f'±{out["margin"]:g} {u}' + (f' ({out["margin_reason"]})' if out['margin_reason'] else '')
            if out['margin'] else 'none given')
  lines += ['## Platform gap', '', out['gap_note'], f'equivalence margin: {margin}', '']
  if out['gap'] is not None:
    lines.append(style.markdown([{
        'gap': r['gap'], 'component': r['component'], f'estimate ({u})': style.num(r['estimate']),
        '95% CI': ci(r), 'p': style.pval(r['p']),
        **(tost_cells(r) if r['component'] == 'platform residual' else
           {'90% CI (TOST)': '', 'TOST p': '', 'verdict': ''})} for _, r in out['gap'].iterrows()]))
  if out['arms'] is not None:
    lines.append(style.markdown([{'arm': r['arm'], f'minus reference arm ({u})':
                                  style.num(r['estimate']), '95% CI': ci(r), 'p': style.pval(r['p'])}
                                 for _, r in out['arms'].iterrows()]))
  lines += ['## Excluded runs', '', style.markdown([{'run': r['run'], 'reason': r['reason']}
                                                   for _, r in out['excluded'].iterrows()])]
  return '\n'.join(lines)
