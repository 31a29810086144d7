"""The churn ladder: every row of analysis/numbers/agreement.py's table as a point (mean churn over
seeds) with its 95% t-interval over seeds and the per-seed values as small dots, rungs from top to
bottom in agreement.KINDS order (nondeterminism, identical arithmetic, noise, each numerics setting,
platform, seed). Colour: the platform of the pair (style.platform_colors, as in every figure), black
for pairs across platforms. Drawn at its printed width (style.TWO_COLUMN_IN)."""

import textwrap

import numpy as np

from analysis.figures import style
from analysis.numbers import agreement

ACROSS = 'across platforms'
ACROSS_COLOR = '#000000'
ROW_IN = 0.17  # inches per row
LABEL_CHARS = 58
MAX_ROWS = 48  # beyond this many rows a page is unreadable: the numerics rows are cut to fit


def drawn_rows(table):
  """(the rows drawn, how many numerics-setting rows are left out to keep MAX_ROWS). Where a
  platform has a 'seed_all' row its arms' own seed rows are not drawn (they stay in the CSV)."""
  pooled = set(table.loc[table['kind'] == 'seed_all', 'platform_a'])
  table = table[~((table['kind'] == 'seed') & table['platform_a'].isin(pooled))]
  if len(table) <= MAX_ROWS:
    return table, 0
  contrast = table['kind'] == 'contrast'
  keep = max(MAX_ROWS - int((~contrast).sum()), 0)
  dropped = table[contrast].index[keep:]
  return table.drop(index=dropped), len(dropped)


def row_label(row):
  """'kind: a vs b' (one arm: 'kind: a'), wrapped."""
  kind = agreement.KIND_TITLES[row['kind']].split(' (')[0]
  a, b = row.get('label_a', row['a']), row.get('label_b', row['b'])
  pair = a if row['a'] == row['b'] else f'{a} vs {b}'
  return textwrap.fill(f'{kind}: {pair}', LABEL_CHARS)


def row_color(row, colors):
  return (colors[row['platform_a']] if row['platform_a'] == row['platform_b'] else ACROSS_COLOR)


def per_seed(row):
  return [float(v) for v in str(row['per_seed_pct']).split(', ') if v]


def draw(table):
  """The ladder's figure (matplotlib Figure)."""
  table, left_out = drawn_rows(table)
  style.apply()
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  platforms = sorted(set(table['platform_a']) | set(table['platform_b']))
  colors = style.platform_colors(platforms)
  lines = sum(row_label(r).count('\n') + 1 for _, r in table.iterrows())
  fig, ax = plt.subplots(figsize=(style.TWO_COLUMN_IN, 0.9 + ROW_IN * max(lines, 2)),
                         constrained_layout=True)
  for y, (_, r) in enumerate(table.iterrows()):
    color = row_color(r, colors)
    if np.isfinite(r['ci_low']):
      ax.plot([r['ci_low'], r['ci_high']], [y, y], color=color, lw=1.2)
    ax.plot(per_seed(r), [y] * len(per_seed(r)), '.', color=color, ms=2.5, alpha=0.45)
    ax.plot([r['churn_pct']], [y], 'o', color=color, ms=4)
  ax.set_yticks(range(len(table)), [row_label(r) for _, r in table.iterrows()], fontsize=6.5)
  ax.invert_yaxis()
  ax.set_xlim(left=0)
  ax.grid(axis='x', color='#DDDDDD', lw=0.5)
  ax.grid(axis='y', visible=False)
  unit = ' / '.join(sorted(set(table['unit'])))
  ax.set_xlabel(f'churn: % of test {unit} predicted differently\n(mean over seeds, '
                '95% t-interval over seeds; dots: each seed)')
  handles = [ax.plot([], [], 'o', color=colors[p], label=p)[0] for p in platforms]
  if (table['platform_a'] != table['platform_b']).any():
    handles.append(ax.plot([], [], 'o', color=ACROSS_COLOR, label=ACROSS)[0])
  fig.legend(handles=handles, loc='outside upper right', ncol=len(handles), fontsize=6.5)
  if left_out:
    ax.set_title(f'{left_out} numerics-setting pairs not drawn (MAX_ROWS): see '
                 'report_agreement.csv', fontsize=7)
  return fig


def churn_ladder(table, out_dir):
  """Write churn_ladder.pdf and .png (300 dpi, printed size) into out_dir; returns the paths."""
  return style.save(draw(table), out_dir, 'churn_ladder', crop=False)
