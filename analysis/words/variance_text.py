"""The variance split (analysis/agreement.py) in words: its rows for report.md and report.tex
(each component's variance, sd, share and 95% interval, or the df that forbids one; a negative
estimate's truncation said in words) and the first page's line.
Reference: docs/statistics.md "Report and figures".
"""

import numpy as np

from analysis import agreement
from analysis.words.tables import num

CAPTION = (
  'Where the variance between runs of one arm comes from: the two-way crossed '
  'random-effects ANOVA (method of moments) of init seed × data-order seed (× replicates); '
  'variance in {unit}², sd in {unit}, share of the total; 95% interval of each variance '
  "by Satterthwaite's df (exact χ² for a single mean square), none below "
  f'{agreement.MIN_CI_DF:g} df (the upper bound would exceed 39× the estimate).'
)


def ci_text(r):
  """'[low, high] (df ν)', or why there is no interval."""
  if r['truncated'] or not r['estimate'] > 0:
    return 'none: estimate truncated at 0'
  if not np.isfinite(r['ci_low']):
    return f'none: df {r["ci_df"]:.2g} < {agreement.MIN_CI_DF:g} (more seeds needed)'
  return f'[{num(r["ci_low"], 3)}, {num(r["ci_high"], 3)}] (df {r["ci_df"]:.2g})'


def truncation(r, unit):
  """The truncation of a negative estimate in words ('' when none)."""
  if not r['truncated']:
    return ''
  return (
    f'estimated {r["estimate"]:+.3g} {unit}², below 0, so set to 0: the data show no '
    f'{r["component"]} variance beyond what the other sources give at these seeds'
  )


def design(group):
  """'3 init × 3 data-order seeds × 2 replicates (18 runs)' of one arm's rows."""
  ms = group.set_index('component')
  i, j = int(ms.loc['init', 'df']) + 1, int(ms.loc['data order', 'df']) + 1
  r = int(group['replicates'].iloc[0])
  reps = f' × {r} replicates' if r > 1 else ', no replicates'
  return f'{i} init × {j} data-order seeds{reps} ({int(group["runs"].iloc[0])} runs)'


def rows(table, unit, labels=None):
  """One row of strings per arm and component: arm, design, component, variance, sd, share,
  95% CI, note."""
  labels = labels or {}
  out = []
  for arm, group in table.groupby('arm', sort=False):
    for _, r in group.iterrows():
      out.append(
        {
          'arm': labels.get(arm, arm),
          'design': design(group),
          'component': r['component'],
          f'variance ({unit}²)': num(r['variance'], 3),
          f'sd ({unit})': num(r['sd'], 3),
          'share (%)': num(r['share_pct'], 1),
          '95% CI of the variance': ci_text(r),
          'note': truncation(r, unit),
        }
      )
  return out


def first_page_line(section, unit, labels=None):
  """'**Variance between runs** of native (3 init × 3 ...): init 62 % (sd 1.1 pp), ...' per arm,
  and the arms whose seeds vary without a split; [] when there is neither."""
  labels = labels or {}
  lines = []
  table = section.variance if section is not None else None
  if table is not None and not table.empty:
    for arm, group in table.groupby('arm', sort=False):
      parts = [
        f'{r["component"]} {num(r["share_pct"], 0)} % (sd {num(r["sd"], 2)} {unit}'
        + (', truncated at 0' if r['truncated'] else '')
        + ')'
        for _, r in group.iterrows()
      ]
      lines.append(
        f'**Variance between runs** of {labels.get(arm, arm)} ({design(group)}): '
        + ', '.join(parts)
        + '; intervals in "Where the variance comes from" below.'
      )
  for note in section.variance_notes if section is not None else []:
    lines.append(f'**Variance between runs**: no split for {note}.')
  return lines
