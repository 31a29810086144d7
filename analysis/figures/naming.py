"""What a figure calls things: short arm labels (what differs between the arms, never a whole
config), and the context line every study figure carries as its subtitle (data set, n, platform
and device), so that a figure read alone says what it was measured on.
Reference: docs/statistics.md "Report and figures".
"""

import textwrap

from analysis import inputs

LABEL_CHARS = 30  # an arm label longer than this is cut (with '…'): a legend, not a config dump
NAMED = ('profile=',)  # fields whose value names itself: 'tpu_default', not 'profile=tpu_default'


ONE_ARM = 'all runs'  # the label of the only arm: nothing tells it from another


def cut(text):
  """`text` in at most LABEL_CHARS characters ('…' where cut)."""
  return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1].rstrip(', ') + '…'


def short_labels(labels, drop=(), one=ONE_ARM):
  """{label: short label} of arm labels 'a, b=1, c=2' (analysis/inputs/labels.py): the parts
  that differ between the arms (where every part is shared, the first), without the parts in
  `drop` ({label: parts to leave out}, e.g. the platform the colour shows), named fields by their
  value (an empty one left out), at most LABEL_CHARS characters; the only arm is `one` (None: its
  own label, cut); distinct labels stay distinct."""
  labels = list(dict.fromkeys(map(str, labels)))
  if len(labels) == 1:
    return {labels[0]: one or cut(labels[0])}
  parts = {
    label: [p for p in label.split(', ') if p not in set((drop or {}).get(label, ()))]
    or label.split(', ')
    for label in labels
  }
  common = set.intersection(*(set(p) for p in parts.values()))
  out = {}
  for label in labels:
    keep = [p for p in parts[label] if p not in common] or parts[label][:1]
    keep = [p.split('=', 1)[1] if p.startswith(NAMED) else p for p in keep]
    out[label] = cut(', '.join(p for p in keep if p) or label)
  seen = {}
  for label in labels:  # cut labels that collide get a number
    seen.setdefault(out[label], []).append(label)
  for text, group in seen.items():
    if len(group) > 1 and text.endswith('…'):
      out.update({label: f'{text} {i + 1}' for i, label in enumerate(group)})
  return out


def recorded(runs, *columns):
  """The first of `columns` with a recorded value (inputs.distinct), else None."""
  for column in columns:
    if column in runs:
      text = inputs.distinct(runs[column])
      if text is not None:
        return text
  return None


def context(out, width=None):
  """'digits (test 360 images) · n = 16 seeds per arm, 256 runs · cpu: cpu; gpu: NVIDIA H100':
  the data set, n and each platform's device of an analysis.numbers.result.Analysis (what was
  recorded), wrapped to `width` characters when given."""
  runs = out.runs
  data = recorded(runs, 'config.data.name', 'data.name')
  test = recorded(runs, 'data.test_size')
  n = sorted(set(out.arms['n'])) if not out.arms.empty else [0]
  units = getattr(out, 'units', None)
  models = bool(
    out.seeded
    and units is not None
    and units['seed'].astype(str).str.contains(' (init ', regex=False).any()
  )
  what = ('model' if models else 'seed' if out.seeded else 'run') + ('' if n == [1] else 's')
  what += ' (seed, init, data)' if models else ''
  each = f'{n[0]}' if len(n) == 1 else f'{n[0]}–{n[-1]}'
  devices = '; '.join(
    f'{p}: {f.device_kind}' if f.device_kind and f.device_kind.lower() != p.lower() else p
    for p, f in out.software.platforms.items()
  )
  runs_text = f'{len(runs)} run{"" if len(runs) == 1 else "s"}'
  parts = [
    f'{data} (test {test} images)' if data and test else data or 'data set not recorded',
    f'n = {each} {what} per arm, {runs_text}',
    devices or 'platform not recorded',
  ]
  text = ' · '.join(parts)
  return '\n'.join(textwrap.wrap(text, width)) if width else text


def subtitle(fig, text, fontsize=6.5):
  """The context line as the figure's subtitle, left-aligned above the axes (inside the figure's
  printed size: constrained layout makes room for it)."""
  fig.suptitle(text, x=0.01, ha='left', fontsize=fontsize, color='#444444')
