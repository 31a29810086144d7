"""What the tables call things: arm labels from the group-by values (runrecord.record names the
fields), seeds as integers, seeds in order, runs of consecutive seeds as ranges.
Reference: docs/statistics.md "Arms, seeds and replicates".
"""

import numpy as np
import pandas as pd

from runrecord import record, rules


def seed_key(seed):
  """Sort seeds numerically when they are numbers, else as text."""
  try:
    return (0, float(seed), '')
  except (TypeError, ValueError):
    return (1, 0.0, str(seed))


def seed_text(seeds):
  """'0–4 7 9': the distinct seeds in order, 3 or more consecutive integers as one range."""

  def whole(s):
    return isinstance(s, (int, np.integer))

  parts = []  # [first, last] of each run of consecutive integers (or a lone seed)
  for seed in sorted(set(seeds.dropna()), key=seed_key):
    if parts and whole(seed) and whole(parts[-1][1]) and seed == parts[-1][1] + 1:
      parts[-1][1] = seed
    else:
      parts.append([seed, seed])
  return ' '.join(str(a) if a == b else f'{a} {b}' if b == a + 1 else f'{a}–{b}' for a, b in parts)


def whole_numbers(values):
  """A float column of whole numbers (pandas reads integers as floats when a value is missing) as
  Python ints, None where missing; any other column unchanged. Seeds then print as 0 1, not 0.0."""
  v = values.to_numpy()
  if values.dtype.kind != 'f' or not np.all(np.isnan(v) | (np.isfinite(v) & (v == np.floor(v)))):
    return values
  return pd.Series([None if np.isnan(x) else int(x) for x in v], index=values.index, dtype=object)


def label_columns(keys, names):
  """The group columns an arm label needs: in order, each one that splits the arms further."""
  chosen, distinct = [], 1
  for i, _ in enumerate(names):
    count = len({tuple(k[j] for j in chosen + [i]) for k in keys})
    if count > distinct:
      chosen, distinct = chosen + [i], count
  return chosen or list(range(len(names)))


def arm_label(values, names, chosen):
  """'tpu, compute_dtype=bfloat16, optim.learning_rate=0.002': the chosen group values, platform
  and device kind unnamed, the others by rules.field_name."""
  return ', '.join(
    str(values[i])
    if names[i] in record.ARM_CONTEXT
    else f'{rules.field_name(names[i])}={values[i]}'
    for i in chosen
  )


def arm_labels(runs, group_by):
  """Each run's arm label: the values of `group_by` (as text), each distinct key labelled once."""
  texts = [whole_numbers(runs[g]).astype(str) for g in group_by]
  keys = list(zip(*texts, strict=True)) if texts else [()] * len(runs)
  distinct = list(dict.fromkeys(keys))
  chosen = label_columns(distinct, group_by)
  label = {k: arm_label(k, group_by, chosen) for k in distinct}
  return [label[k] for k in keys]
