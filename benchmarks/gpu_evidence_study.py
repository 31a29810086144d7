"""The digits study on the GPU agenda (benchmarks/gpu_evidence_parts.py): its seeds, slices and
replicate roots, the spec each sweep runs (benchmarks/study_seeds.py), and the headlines computed
from its runs' records (how many completed, their accuracy, same-seed pairs compared).
"""

import os

from sweeps import scripts

# The study's seeds, run STUDY_SLICE seeds a part, STUDY_PARALLEL runs at a time; the replicates'.
STUDY_SEEDS, STUDY_SLICE, STUDY_PARALLEL = 16, 2, 8
REPLICATE_SEEDS = 2
# The toy study: digits' smoke preset, one epoch of 6 steps, one arm.
TOY_STUDY = 'smoke,num_epochs=1,optim.freeze_epochs=0,batch_size=256,arms=1'


def study_spec(ctx, seeds, only=None, extra=''):
  """benchmarks/study_seeds.py's spec: the study (the toy one in smoke mode) over `seeds`."""
  parts = [
    TOY_STUDY if ctx.smoke else 'study',
    extra,
    f'seeds={seeds}',
    f'only={only[0]}-{only[1]}' if only else '',
  ]
  return 'benchmarks/study_seeds.py:' + ','.join(p for p in parts if p)


def commands_file(root):
  return os.path.join(root, scripts.COMMANDS_FILE)


def study_root(ctx):
  return os.path.join(ctx.out, 'study', 'runs')


def seed_range(ctx, first):
  """The slice's seeds: first..first+STUDY_SLICE-1; seed 0 at the toy size."""
  return (0, 0) if ctx.smoke else (first, first + STUDY_SLICE - 1)


def replicate_roots(ctx, deterministic):
  folder = os.path.join(ctx.out, 'replicates', f'gpu_deterministic_{deterministic}')
  return [os.path.join(folder, name) for name in ('a', 'b')]


def runs_summary(found, seeds=None):
  """'N of M runs completed; test accuracy mean (min-max)' of the records `found` (None: nothing
  saved) of `seeds` (None: all)."""
  found = [r for r in found if r and (seeds is None or r.get('seed') in seeds)]
  done = [r for r in found if r.get('status') == 'completed']
  accuracy = [100 * r['final']['test_accuracy'] for r in done if 'test_accuracy' in r['final']]
  line = f'{len(done)} of {len(found)} runs completed'
  if accuracy:
    line += (
      f'; test accuracy mean {sum(accuracy) / len(accuracy):.2f} % '
      f'({min(accuracy):.2f}-{max(accuracy):.2f})'
    )
  return line


def replicate_summary(a, b):
  """Same-seed pairs (a run of records `a`, the same arm and seed in `b`; {run path: record}),
  both completed: how many end in bit-identical states (the record's state_digest, a CRC-32 of
  every leaf) and with equal test accuracy, and the largest accuracy difference |a - b| in pp."""
  pairs = [
    (a[k], b[k])
    for k in sorted(a.keys() & b.keys())
    if a[k] and b[k] and a[k].get('status') == b[k].get('status') == 'completed'
  ]
  if not pairs:
    return 'no completed same-seed pair'
  same_state = sum(
    x.get('state_digest') is not None and x.get('state_digest') == y.get('state_digest')
    for x, y in pairs
  )
  gaps = [abs(x['final']['test_accuracy'] - y['final']['test_accuracy']) * 100 for x, y in pairs]
  return (
    f'{len(pairs)} same-seed pairs: bit-identical final states {same_state}, equal test '
    f'accuracy {sum(g == 0 for g in gaps)}, largest accuracy difference {max(gaps):.2f} pp'
  )
