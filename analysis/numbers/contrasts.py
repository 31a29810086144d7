"""A study's pre-registered contrasts, from its declaration (analysis/inputs/declaration.py): on
each platform, every arm against the reference arm (Δ = arm − reference, paired by seed where the
runs pair), judged as one family: Holm over exactly these contrasts (stats.judge), 7 per platform
for the 8 arms of configs/digits.py's fraction. The noise arm is one of them and also sets the noise
floor (analysis.numbers.attribution.noise_floor, per platform). Numbers and verdict categories only.

  arms = arm_levels(out, declared)     # per arm: platform, factor levels, short label, role
  table = contrast_table(out, declared)
Reference: docs/statistics.md "Contrasts and verdicts".
"""

import pandas as pd

from analysis import declaration
from analysis.declaration import resolve_column
from analysis.numbers import attribution, stats


def factor_columns(runs, declared):
  """{factor: column} of the declared factors other than platform."""
  factors = [f for f in declared.get('factors') or [] if f != 'platform']
  if not factors:
    raise ValueError('--study: the declaration names no factors; add factors to get_study()')
  return {f: resolve_column(runs, f, '--study (factors)') for f in factors}


def matches(levels, wanted):
  """Do the arm's levels equal every level of `wanted` ({factor: level}) that it has?"""
  wanted = {f: declaration.level_text(v) for f, v in (wanted or {}).items() if f in levels}
  return bool(wanted) and all(levels[f] == v for f, v in wanted.items())


def arm_levels(out, declared):
  """One row per arm of stats.arms_and_pairs's `out`: arm, platform, each factor's level, label
  (short, declaration.arm_label), role ('reference' | 'noise' | 'arm'), n, and `order` (the declared
  factor that differs from the reference first, then the label; the noise arm last)."""
  runs = out.runs
  columns = factor_columns(runs, declared)
  first = runs.groupby('arm', sort=False).first()
  n = out.arms.set_index('arm')['n']
  rows = []
  for arm, r in first.iterrows():
    levels = {f: declaration.level_text(r[c]) for f, c in columns.items()}
    role = (
      'reference'
      if matches(levels, declared.get('reference'))
      else 'noise'
      if matches(levels, declared.get('noise_arm'))
      else 'arm'
    )
    differ = [
      i
      for i, f in enumerate(columns)
      if levels[f] != declaration.level_text((declared.get('reference') or {}).get(f))
    ]
    rows.append(
      {
        'arm': arm,
        'platform': str(r['platform']) if 'platform' in r else '',
        **levels,
        'label': declaration.arm_label(declared, levels),
        'role': role,
        'n': n[arm],
        'order': ({'reference': -1, 'noise': len(columns)}.get(role, min(differ or [0]))),
      }
    )
  table = pd.DataFrame(rows).sort_values(['platform', 'order', 'label'], kind='stable')
  clash = table[table.duplicated(['platform', 'label'], keep=False)]
  if not clash.empty:
    a, b = clash['arm'].iloc[:2]
    raise ValueError(
      f'--study: arms {a!r} and {b!r} ({len(clash)} arms in all) have the same declared '
      'factor levels on one platform; declare the factor that separates them '
      '(get_study factors) or --group-by only the declared ones'
    )
  return table.reset_index(drop=True)


def family(arms):
  """[(arm, reference arm)] of the declared contrasts, in platform and arm order; arms with n < 2
  and platforms without a reference arm give none."""
  pairs = []
  for _, group in arms.groupby('platform', sort=False):
    ref = group[group['role'] == 'reference']
    if len(ref) == 1 and ref['n'].iloc[0] >= 2:
      pairs += [
        (a, ref['arm'].iloc[0])
        for a in group.loc[(group['role'] != 'reference') & (group['n'] >= 2), 'arm']
      ]
  return pairs


def contrast_table(out, declared, margin=None):
  """The declared contrasts judged as one family (stats.compare rows + stats.judge) with
  platform, label and role of each arm; Δ = arm − reference arm. The arms: out.arm_info
  (analysis/numbers/answer.py) when set, else arm_levels."""
  arms = out.arm_info
  arms = arm_levels(out, declared) if arms is None else arms
  rows = [stats.compare(out, a, b, margin or out.margin) for a, b in family(arms)]
  table = stats.judge(rows)
  if table.empty:
    return table
  info = arms.set_index('arm')
  for col in ('platform', 'label', 'role'):
    table[col] = [info.loc[a, col] for a in table['arm_a']]
  return table


def noise_floors(out, declared, unit):
  """{platform: analysis.numbers.attribution.noise_floor} (paired: the noise arm − the arm it
  perturbs, declared noise_of, else the reference arm) of each platform where both share 2+
  seeds."""
  return attribution.noise_floors(
    out.runs,
    declared.get('noise_arm') or {},
    declared.get('noise_of') or declared.get('reference') or {},
    unit,
    list(factor_columns(out.runs, declared).values()),
  )
