"""Which pairs of arms the churn ladder compares, from the runs table alone (stats.prepare's `runs`:
one row per completed run with `arm`, `platform`, `det`, and the `group_by` columns that define
an arm):

  platform    the same arm on two platforms: equal in every group-by column but platform and
              device kind (so native vs native, and each emulated profile across platforms);
  identical   two arms of one platform whose runs all repeat bit for bit
              (runs_table.run_deterministic) and whose recorded arithmetic is the same: equal
              effective formats (ARITHMETIC) and equal non-numerics group-by columns (on CPU:
              profile f32 and native);
  noise       the noise arm (an effective format among formats.NOISY_FORMATS) vs the arm it
              perturbs: the same arm with its noisy formats read as f32 (the emulated one when
              there is one, as the noise arm is emulated).
Reference: docs/statistics.md "Agreement between models".
"""

import itertools

from numerics import formats
from runrecord import record

EFFECTIVE = 'numerics.effective.'
ARITHMETIC = tuple(
  EFFECTIVE + f
  for f in (
    'conv_format',
    'dense_format',
    'compute_dtype',
    'batchnorm_group',
    'param_dtype',
    'matmul_precision',
  )
)
EMULATED = (EFFECTIVE + 'emulated.conv', EFFECTIVE + 'emulated.dense')
NOISE_FREE = 'f32'  # the format a noisy format perturbs


def arm_facts(runs, group_by):
  """{arm: {column: value as text}} of the group-by, arithmetic and emulation columns, plus
  'deterministic' (every run of the arm repeats bit for bit)."""
  columns = [c for c in dict.fromkeys([*group_by, 'platform', *ARITHMETIC, *EMULATED]) if c in runs]
  facts = {}
  for arm, group in runs.groupby('arm', sort=True):
    first = group.iloc[0]
    facts[arm] = {c: str(first[c]) for c in columns}
    facts[arm]['deterministic'] = bool('det' in group and group['det'].eq(True).all())
  return facts


def equal_in(fa, fb, columns):
  return all(fa.get(c) == fb.get(c) for c in columns)


def not_numerics(group_by):
  """The group-by columns that are neither requested numerics nor where the run executed."""
  return [
    c for c in group_by if not c.startswith(record.ARM_PREFIX) and c not in record.ARM_CONTEXT
  ]


def platform_pairs(runs, group_by):
  """[(a, b)]: the same arm levels on two platforms (a's platform sorts first)."""
  facts = arm_facts(runs, group_by)
  same = [c for c in group_by if c not in record.ARM_CONTEXT]
  return [
    (a, b) if facts[a].get('platform', '') <= facts[b].get('platform', '') else (b, a)
    for a, b in itertools.combinations(facts, 2)
    if facts[a].get('platform') != facts[b].get('platform') and equal_in(facts[a], facts[b], same)
  ]


def identical_pairs(runs, group_by):
  """[(a, b)]: arms of one deterministic platform with the same recorded arithmetic."""
  facts = arm_facts(runs, group_by)
  same = ['platform', 'device_kind', *ARITHMETIC, *not_numerics(group_by)]
  return [
    (a, b)
    for a, b in itertools.combinations(facts, 2)
    if facts[a]['deterministic']
    and facts[b]['deterministic']
    and all(c in facts[a] for c in ARITHMETIC)
    and equal_in(facts[a], facts[b], same)
  ]


def noise_pairs(runs, group_by):
  """[(noise arm, the arm it perturbs)] on each platform (module doc)."""
  facts = arm_facts(runs, group_by)
  same = ['platform', 'device_kind', *not_numerics(group_by)]
  pairs = []
  for noisy, fn in facts.items():
    if not any(fn.get(c) in formats.NOISY_FORMATS for c in ARITHMETIC):
      continue
    quiet = {c: NOISE_FREE if fn.get(c) in formats.NOISY_FORMATS else fn.get(c) for c in ARITHMETIC}
    found = [
      arm
      for arm, f in facts.items()
      if arm != noisy and equal_in(f, fn, same) and equal_in(f, quiet, ARITHMETIC)
    ]
    emulated = [arm for arm in found if equal_in(facts[arm], fn, EMULATED)]
    pairs += [(noisy, arm) for arm in (emulated or found)]
  return pairs
