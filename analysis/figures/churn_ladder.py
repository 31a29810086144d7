"""The churn ladder: every row of analysis/numbers/agreement.py's table as a point (mean churn over
seeds) with its 95% t-Wilson interval over seeds (inside 0–100 %, so nothing is cut at the axis)
and the per-seed values as small dots, rungs from top to bottom in agreement.KINDS order
(nondeterminism, identical arithmetic, noise, each numerics setting, platform, data order only,
initial weights only, seed); each row's label says its kind, its arms by their short labels
(analysis/figures/naming.py) and its n (seeds, or seed pairs). Colour: the platform of the pair
(style.platform_colors, as in every figure), black for pairs across platforms. The x axis runs
from 0 to a little past the largest bound or seed drawn, never past 100 %. Drawn at its printed
width (style.TWO_COLUMN_IN), the study's context (data, n, platforms) as its subtitle.
Reference: docs/statistics.md "Report and figures".
"""

import textwrap

import numpy as np

from analysis import agreement
from analysis.figures import naming, style

ACROSS = 'across platforms'
ACROSS_COLOR = '#000000'
ROW_IN = 0.17  # inches per row
LABEL_CHARS = 66
# What a row's n counts (agreement.py: the units its interval is over).
UNITS = {
  'data order': 'init seeds',
  'init': 'data seeds',
  'seed': 'seed pairs',
  'seed_all': 'clusters',
}
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


def row_label(row, short=None):
  """'kind: a vs b (n 8)' (one arm: 'kind: a (n 8)'), arms by their short labels ({label: short},
  naming.short_labels), wrapped."""
  short = short or {}
  kind = agreement.SHORT_TITLES[row['kind']]
  a, b = (short.get(x, x) for x in (row.get('label_a', row['a']), row.get('label_b', row['b'])))
  head = a.split(': ')[0] + ': '
  if ': ' in a and b.startswith(head):  # 'cpu: f32 vs cpu: native' -> 'cpu: f32 vs native'
    b = b[len(head) :]
  pair = a if row['a'] == row['b'] else f'{a} vs {b}'
  what = UNITS.get(row['kind'], 'seeds')
  return textwrap.fill(f'{kind}: {pair} ({int(row["seeds"])} {what})', LABEL_CHARS)


def x_limit(table):
  """The x axis' right end: 8 % past the largest interval bound or per-seed value drawn (at least
  1 %), at most 100 %."""
  values = [
    v
    for _, r in table.iterrows()
    for v in (r['ci_high'], r['churn_pct'], *per_seed(r))
    if np.isfinite(v)
  ]
  return min(100.0, max(1.0, 1.08 * max(values, default=1.0)))


def row_color(row, colors):
  return colors[row['platform_a']] if row['platform_a'] == row['platform_b'] else ACROSS_COLOR


def per_seed(row):
  return [float(v) for v in str(row['per_seed_pct']).split(', ') if v]


def draw(table, context=None):
  """The ladder's figure (matplotlib Figure); `context` (naming.context) as its subtitle."""
  table, left_out = drawn_rows(table)
  style.apply()
  import matplotlib.pyplot as plt  # here, after style has chosen the Agg backend

  platforms = sorted(set(table['platform_a']) | set(table['platform_b']))
  colors = style.platform_colors(platforms)
  arms = [
    x
    for _, r in table.iterrows()
    for x in (r.get('label_a', r['a']), r.get('label_b', r['b']))
    if not str(x).startswith('every arm on ')
  ]
  short = naming.short_labels(arms, one=None)  # one declared arm keeps its own label
  labels = [row_label(r, short) for _, r in table.iterrows()]
  lines = sum(label.count('\n') + 1 for label in labels)
  fig, ax = plt.subplots(
    figsize=(style.TWO_COLUMN_IN, 1.1 + ROW_IN * max(lines, 2)), constrained_layout=True
  )
  if context:
    naming.subtitle(fig, context)
  for y, (_, r) in enumerate(table.iterrows()):
    color = row_color(r, colors)
    if np.isfinite(r['ci_low']):
      ax.plot([r['ci_low'], r['ci_high']], [y, y], color=color, lw=1.2)
    ax.plot(per_seed(r), [y] * len(per_seed(r)), '.', color=color, ms=2.5, alpha=0.45)
    ax.plot([r['churn_pct']], [y], 'o', color=color, ms=4)
  ax.set_yticks(range(len(table)), labels, fontsize=6.5)
  ax.invert_yaxis()
  ax.set_xlim(0, x_limit(table))
  ax.grid(axis='x', color='#DDDDDD', lw=0.5)
  ax.grid(axis='y', visible=False)
  unit = ' / '.join(sorted(set(table['unit'])))
  ax.set_xlabel(
    f'churn: % of test {unit} predicted differently\n(mean over seeds, 95% '
    't-Wilson interval; dots: seeds; n in brackets)'
  )
  handles = [ax.plot([], [], 'o', color=colors[p], label=p)[0] for p in platforms]
  if (table['platform_a'] != table['platform_b']).any():
    handles.append(ax.plot([], [], 'o', color=ACROSS_COLOR, label=ACROSS)[0])
  fig.legend(handles=handles, loc='outside upper right', ncol=len(handles), fontsize=6.5)
  if left_out:
    ax.set_title(
      f'{left_out} numerics-setting pairs not drawn (MAX_ROWS): see report_agreement.csv',
      fontsize=7,
    )
  return fig


def churn_ladder(given, out_dir, name):
  """The ladder of `given.result`'s agreement table (subtitled with its context) as NAME.pdf and
  .png (300 dpi, printed size) into out_dir; [] without churn rows."""
  out = given.result
  table = out.agreement.table if out is not None and out.agreement else None
  if table is None or table.empty:
    return []
  return style.save(draw(table, naming.context(out, 150)), out_dir, name, crop=False)
