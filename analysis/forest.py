"""Forest plot of analysis.attribution's terms: each estimate with its 95% CI, the noise floor as a
band, the equivalence margin as dashed lines and a zero line; PDF and 300-dpi PNG (analysis/style.py).
"""

import numpy as np

from analysis import style

plt = style.plt
NAME = 'attribution_forest'


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
