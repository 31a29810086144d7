"""A config file: configs/digits.py's study (its arms, its declaration) over more seeds, run in
slices.

  python -m sweeps.sweep --config=benchmarks/study_seeds.py:study,seeds=16,only=4-7 \
      --root=runs/gpu_study --parallel 8

The arg is configs/digits.py's (presets and key=value pairs) plus three keys of this file:
`seeds=N` the study's seed count (declared in study.json as `seeds`), `only=A-B` the seeds this
sweep runs (A to B inclusive, within 0..N-1; default all N), `arms=K` only the first K arms (a toy
size for tests; default all). Slices of one study share a root: each sweep writes the same
declaration and skips completed runs. The runs are configs/digits.py's own: the config a run
records is digits.get_config's, so `analysis` reads them as runs of that study.
Reference: docs/performance.md "The benchmark scripts".
"""

from configs import digits

KEYS = ('seeds', 'only', 'arms')


def split_arg(arg):
  """(digits' arg, {key: text} of this file's keys) from the arg after the colon."""
  rest, mine = [], {}
  for item in filter(None, (s.strip() for s in (arg or '').split(','))):
    key, eq, value = item.partition('=')
    if eq and key.strip() in KEYS:
      mine[key.strip()] = value.strip()
    else:
      rest.append(item)
  return ','.join(rest), mine


def positive(mine, key, default):
  text = mine.get(key, str(default))
  if not text.isdigit() or int(text) < 1:
    raise ValueError(f'benchmarks/study_seeds.py: {key}={text}: give a positive whole number')
  return int(text)


def seeds_of(mine):
  """The seeds this sweep runs: `only=A-B` within range(`seeds`)."""
  count = positive(mine, 'seeds', digits.SEEDS)
  first, _, last = mine.get('only', f'0-{count - 1}').partition('-')
  if not (first.isdigit() and last.isdigit() and int(first) <= int(last) < count):
    raise ValueError(
      f'benchmarks/study_seeds.py: only={mine["only"]}: give A-B with 0 <= A <= B < seeds={count}'
    )
  return range(int(first), int(last) + 1)


def get_config(arg=None):
  return digits.get_config(split_arg(arg)[0])


def get_sweep(arg=None):
  rest, mine = split_arg(arg)
  arms = digits.study_arms(digits.get_config(rest).batch_size)
  arms = arms[: positive(mine, 'arms', len(arms))]
  return [{**arm, 'seed': seed} for arm in arms for seed in seeds_of(mine)]


def get_study(arg=None):
  rest, mine = split_arg(arg)
  return {**digits.get_study(rest), 'seeds': positive(mine, 'seeds', digits.SEEDS)}
