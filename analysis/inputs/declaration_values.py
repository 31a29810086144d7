"""Each value a study's declaration (analysis/inputs/declaration.py) may hold, checked on its own:
why a margin, a share, a seed count or list, the factors, an arm {factor: level}, the platform
profiles, the labels or the platform pairs to compare are not one (None: they are), and the
--compare flag, which gives the pairs on the command line.
Reference: docs/statistics.md "A study and its declaration".
"""

import json
import math

# The largest margin taken: in pp an accuracy difference never exceeds 100, so a wider margin
# calls every difference equivalent (inf, 1e308: "-12.92 pp equivalent").
MAX_MARGIN = 100.0
SEED_MAX = 2**32 - 1  # the PRNG's range (configs/validation.py SEED_MAX)


def margin_problem(value):
  """Why `value` is not an equivalence margin (None when it is one): a margin is a number (not
  text, not true/false), finite, above 0 and at most MAX_MARGIN."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return (
      f'{value!r} is not a number; give the margin as a number, e.g. 0.5 (pp for an '
      "accuracy, else the metric's units)"
    )
  if not 0 < value <= MAX_MARGIN:
    return (
      f'{value!r} is not a usable margin; give a number above 0 and at most {MAX_MARGIN:g} '
      "(pp for an accuracy, else the metric's units), e.g. 0.5"
    )
  return None


def check_margin(value, where):
  """`value` as a float when it is a margin (margin_problem), else a ValueError naming `where` (the
  flag, or the study.json path and field it came from)."""
  problem = margin_problem(value)
  if problem:
    raise ValueError(f'{where}: {problem}')
  return float(value)


def text_problem(value):
  return None if isinstance(value, str) else f'{value!r} is not text; write it in quotes'


def positive_problem(value):
  """Why `value` is not a positive finite number (an sd, pp)."""
  real = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  return None if real and value > 0 else f'{value!r} is not a positive number; give e.g. 1.0 (pp)'


def share_problem(value):
  """Why `value` is not a share of the gap: a number in (0, 1] (0.5: half the gap)."""
  real = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  return (
    None
    if real and 0 < value <= 1
    else (f'{value!r} is not a share in (0, 1]; give e.g. 0.5 (half the gap), not a percent')
  )


def whole(value):
  """Whether `value` is a whole number (6 or 6.0, not True, not 6.5)."""
  return (
    isinstance(value, (int, float))
    and not isinstance(value, bool)
    and math.isfinite(value)
    and value == int(value)
  )


def seeds_problem(value):
  """Why `value` is not a seed count (k: seeds 0..k-1) or a list of distinct whole-number seeds
  in the PRNG's range [0, 2^32 - 1]."""
  if isinstance(value, list):
    bad = [s for s in value if not (whole(s) and 0 <= s <= SEED_MAX)]
    if not value or bad:
      return (
        f'{bad[0] if bad else value!r} is not a seed; give whole numbers in [0, {SEED_MAX}], '
        'e.g. [0, 1, 2, 3]'
      )
    repeated = sorted({int(s) for s in value if value.count(s) > 1})
    return f'seed {repeated[0]} is listed twice; list each seed once' if repeated else None
  if whole(value) and value >= 1:
    return None
  return (
    f'{value!r} is not a seed count; give a positive whole number k (seeds 0..k-1) or a '
    'list of seeds, e.g. [0, 1, 2, 3]'
  )


def factors_problem(value):
  if isinstance(value, str):
    return (
      f'{value!r} is text, not a list (it would be read letter by letter); write '
      f'[{json.dumps(value)}]'
    )
  if not isinstance(value, list) or not all(isinstance(f, str) and f.strip() for f in value):
    return f'{value!r} is not a list of factor names; write e.g. ["platform", "profile"]'
  repeated = [f for f in dict.fromkeys(value) if value.count(f) > 1]
  return f'{repeated[0]!r} is listed twice; list each factor once' if repeated else None


def pairs_of(value):
  """{factor: level} of an arm as a declaration writes it ({factor: level}, or a list of
  'factor=level' texts), or None when it is neither."""
  if isinstance(value, dict):
    return value
  if isinstance(value, list) and all(isinstance(v, str) and '=' in v for v in value):
    return dict(str(v).split('=', 1) for v in value)
  return None


def arm_problem(value, single=False):
  """Why `value` is not an arm ({factor: level}: names and levels text or numbers)."""
  arm = pairs_of(value)
  example = '{"profile": "native"}'
  if not arm:
    return f'{value!r} is not an arm; give {{factor: level}}, e.g. {example}'
  bad = [
    f'{k}: {v!r}'
    for k, v in arm.items()
    if not (isinstance(k, str) and k) or isinstance(v, (dict, list, type(None)))
  ]
  if bad:
    return f'{bad[0]} is not factor: level (a level is text or a number); e.g. {example}'
  if single and len(arm) != 1:
    return f'{value!r} names {len(arm)} factors; the native arm is one factor=level, e.g. {example}'
  return None


def platform_profile_problem(value):
  if not isinstance(value, dict) or not value:
    return f'{value!r} is not {{platform: level}}; give e.g. {{"gpu": "jax_gpu_default"}}'
  bad = [
    f'{k}: {v!r}'
    for k, v in value.items()
    if not (isinstance(k, str) and k.strip() == k and k) or not isinstance(v, str) or not v
  ]
  return (
    f'{bad[0]} is not platform: profile level (both text), e.g. "gpu": "jax_gpu_default"'
    if bad
    else None
  )


def label_problem(spec):
  """Why a factor's label `spec` cannot label a level: text that formats one value ('BN/{}'), or
  {level: label text}."""
  if isinstance(spec, dict):
    bad = [f'{k}: {v!r}' for k, v in spec.items() if not isinstance(v, str)]
    return f'{bad[0]} is not a label (text)' if bad else None
  if not isinstance(spec, str):
    return f'{spec!r} is neither a format text ("BN/{{}}") nor {{level: label}}'
  try:
    spec.format('x')
  except (IndexError, KeyError, ValueError) as e:
    return (
      f'{spec!r} does not format one level ({type(e).__name__}: {e}); write {{}} where the '
      'level goes, e.g. "BN/{}"'
    )
  return None


def labels_problem(value):
  if not isinstance(value, dict):
    return f'{value!r} is not {{factor: label}}; give e.g. {{"batchnorm_group": "BN/{{}}"}}'
  for factor, spec in value.items():
    problem = label_problem(spec)
    if problem:
      return f'{factor}: {problem}'
  return None


def compare_problem(value):
  """Why `value` is not a list of platform pairs (None when it is one): a non-empty list of
  2-element lists of two different platform names (text), no pair given twice."""
  example = 'e.g. [["tpu", "gpu"], ["tpu", "cpu"]]'
  if not isinstance(value, (list, tuple)) or not value:
    return f'{value!r} is not a list of platform pairs; give {example}'
  seen = set()
  for pair in value:
    if (
      not isinstance(pair, (list, tuple))
      or len(pair) != 2
      or not all(isinstance(p, str) and p for p in pair)
    ):
      return f'{pair!r} is not a pair of platform names; give {example}'
    if pair[0] == pair[1]:
      return f'{list(pair)!r} compares {pair[0]} with itself; give two different platforms'
    if frozenset(pair) in seen:
      return f'{list(pair)!r} is given twice (in either order); give each pair once'
    seen.add(frozenset(pair))
  return None


def parse_compare(items):
  """--compare A:B [C:D ...] as [[A, B], ...] (checked as compare_problem; None when not given)."""
  if not items:
    return None
  pairs = [str(item).split(':') for item in items]
  bad = next((item for item, pair in zip(items, pairs, strict=True) if len(pair) != 2), None)
  problem = (
    f'{bad!r} is not A:B; write e.g. --compare tpu:gpu tpu:cpu'
    if bad is not None
    else compare_problem(pairs)
  )
  if problem:
    raise ValueError(f'--compare: {problem}')
  return pairs


def add_compare_argument(parser):
  """The --compare flag of the commands that decompose a platform gap."""
  parser.add_argument(
    '--compare',
    nargs='+',
    default=None,
    metavar='A:B',
    help='platform pairs whose gap A − B is decomposed, the first the question '
    '(default: the declared compare, else every pair, tpu before gpu before '
    'cpu); overriding the declared pairs makes the analysis exploratory',
  )
