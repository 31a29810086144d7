"""The command line of the step benchmarks (bench_step, bench_determinism, bench_emulate,
bench_epoch, bench_feed, bench_vs_torch, profile_step): the config as train.py loads it, shorthand
flags for its common fields, the timing flags.

Light on purpose (argparse and configs/loader.py, which imports no JAX): each benchmark builds its
parser from here above its heavy imports and answers --help and a bad flag with `parse_flags`
before JAX loads; `parse` then loads, resolves and applies the config.
Reference: docs/performance.md "The benchmark scripts".
"""

import sys

from benchmarks import common
from configs import loader

# The CelebA study's model and numerics (ImageNet stem, f32, platform-default precision), at a
# size a CPU times in seconds per step.
DEFAULT_CONFIG = 'configs/celeba.py:data.image_size=64,batch_size=64'
# Shorthand flags (argparse dest) and the config field each sets, when given.
SHORTHANDS = (
  ('image_size', 'data.image_size'),
  ('batch', 'batch_size'),
  ('width', 'model.width'),
  ('stem', 'model.stem'),
  ('compute_dtype', 'numerics.compute_dtype'),
  ('matmul_precision', 'numerics.matmul_precision'),
  ('profile', 'numerics.profile'),
  ('format', 'numerics.conv_format'),
  ('format', 'numerics.dense_format'),
  ('emulate_impl', 'numerics.emulate_impl'),
  ('conv_impl', 'numerics.conv_impl'),
  ('flip', 'data.flip'),
)


def add_args(parser):
  """The shorthand config flags (default: the config's value) and the timing flags."""
  parser.epilog = (
    f'--config FILE[:ARGS] (default {DEFAULT_CONFIG}) and --config.FIELD=VALUE '
    'overrides as train.py takes them; the shorthand flags set one field each, '
    'checked as train.py checks it (a bad value: one line naming the choices).'
  )
  parser.add_argument('--image-size', type=int, help='data.image_size')
  parser.add_argument('--batch', type=int, help='batch_size (global)')
  parser.add_argument('--width', type=float, help='model.width')
  parser.add_argument('--stem', help="model.stem: 'imagenet' or 'small'")
  parser.add_argument('--compute-dtype', help='numerics.compute_dtype')
  parser.add_argument('--matmul-precision', help='numerics.matmul_precision')
  parser.add_argument('--profile', help='numerics.profile (numerics/profiles.py)')
  parser.add_argument(
    '--format', help='numerics.conv_format and numerics.dense_format (numerics/formats.py)'
  )
  parser.add_argument('--emulate-impl', help='numerics.emulate_impl: auto, reference or fast')
  parser.add_argument('--conv-impl', help='numerics.conv_impl: auto, xla or im2col')
  parser.add_argument('--flip', action='store_true', default=None, help='data.flip')
  parser.add_argument('--num-classes', type=int, default=1000, help='classes of the synthetic data')
  parser.add_argument('--steps', type=int, default=10, help='steps per timed window')
  parser.add_argument('--windows', type=int, default=5, help='timed windows (median reported)')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps after compiling')
  parser.add_argument('--devices', type=int, default=0, help='use the first N devices (0: all)')


def shorthand_overrides(args, shorthands=SHORTHANDS):
  """[(config field, value)] of the shorthand flags given on the command line."""
  return [
    (field, getattr(args, dest))
    for dest, field in shorthands
    if getattr(args, dest, None) is not None
  ]


def parse_flags(parser, argv):
  """(args, config spec, --config.* overrides): `--config` and `--config.*` split off
  (configs/loader.py), the rest parsed by `parser` (--help and a bad flag end here, before any
  heavy import)."""
  spec, overrides, rest = loader.split_argv(list(sys.argv[1:] if argv is None else argv))
  return parser.parse_args(rest), spec, overrides


def parse(parser, argv, overrides_of=shorthand_overrides, resolve=True):
  """(args, config): parse_flags, then the config loaded with overrides_of(args) then the
  `--config.*` overrides, resolved (configs/validation.py) and its numerics applied
  (numerics.setup.configure, before any backend starts). `resolve=False` (a benchmark of several
  variants of one config, each resolved on its own): the config as loaded, its process settings
  applied all the same. Bad input: one line and exit code 2."""
  from configs import validation
  from numerics import setup as numerics_setup

  args, spec, overrides = parse_flags(parser, argv)
  try:
    loaded = loader.load(spec or DEFAULT_CONFIG, overrides_of(args) + overrides)
    config = validation.resolve(loaded)
    numerics_setup.configure(config)
  except ValueError as e:  # ConfigError is a ValueError
    common.fail(str(e).splitlines()[0])
  return args, (config if resolve else loaded)
