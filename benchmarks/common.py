"""What the benchmarks share: the record's first lines, the one-line error, alternating timed
windows, tables, flags of one mode, the step benchmarks' command line (docs/performance.md)."""

import argparse
import os
import platform as platform_lib
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from configs import common as config_common
from configs import validation
from trainer import process


def parser(module: str, doc: str) -> argparse.ArgumentParser:
  """`python -m benchmarks.<module>`'s parser, described by its docstring's first paragraph."""
  text = ' '.join(doc.split('\n\n')[0].split())
  return argparse.ArgumentParser(prog=f'python -m benchmarks.{module}', description=text)


def fail(message: str) -> NoReturn:
  """Bad input, found before any compute: one line on stderr, exit code 2."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def allocate_gpu_memory_on_demand() -> None:
  """XLA_PYTHON_CLIENT_PREALLOCATE=false unless a JAX memory variable is set: room for torch in
  the same process. Call before anything starts JAX's backend."""
  if not any(name in os.environ for name in process.MEMORY_VARIABLES):
    os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'


def host() -> str:
  """'cpus 2 | 2026-11-25 10:00:00 UTC | load average 1.00 0.90 0.80': the end of a record line."""
  try:
    load = '%.2f %.2f %.2f' % os.getloadavg()
  except OSError:
    load = 'n/a'
  return f'cpus {os.cpu_count()} | {time.strftime("%Y-%m-%d %H:%M:%S %Z")} | load average {load}'


def environment() -> str:
  """Device, versions, host and GPU memory settings: the record's first line (starts JAX)."""
  import flax
  import jax
  import optax

  d = jax.devices()[0]
  return (
    f'device: {d.platform} {getattr(d, "device_kind", "")} x{jax.device_count()} | '
    f'jax {jax.__version__}, jaxlib {getattr(jax.lib, "__version__", "")}, '
    f'flax {flax.__version__}, optax {optax.__version__}, python '
    f'{platform_lib.python_version()} | {host()} | GPU memory: {process.memory_settings()}'
  )


def command_line(module: str, argv: Sequence[str] | None, first: str | None = '') -> None:
  """Prints `first` (default environment(); None: nothing), then 'command: ...' of `argv`."""
  if first is not None:
    print(first or environment())
  args = sys.argv[1:] if argv is None else argv
  print(f'command: python -m benchmarks.{module} ' + ' '.join(args))


def alternate(runners: Mapping[Any, Callable[[int], float]], args) -> dict[Any, list[float]]:
  """{name: [seconds per step of each window]} of runners run(n) -> seconds of n steps: each in
  turn per window, so that a busy or throttling machine slows them all alike."""
  for run_steps in runners.values():
    run_steps(args.warmup)
  times: dict[Any, list[float]] = {name: [] for name in runners}
  for _ in range(args.windows):
    for name, run_steps in runners.items():
      times[name].append(run_steps(args.steps) / args.steps)
  return times


def windows(args, unit: str = 'steps') -> str:
  """How alternate() timed: 'median of 5 alternating windows x 10 steps'."""
  return f'median of {args.windows} alternating windows x {args.steps} {unit}'


def fmt(value: float | None, spec: str) -> str:
  """format(value, spec), or 'n/a' for None (a quantity not known here)."""
  return 'n/a' if value is None else format(value, spec)


def spread(seconds: Sequence[float], scale: float = 1e3, digits: int = 2) -> str:
  """'median (min-max)' of `seconds` x `scale` (default: milliseconds)."""
  v = [s * scale for s in seconds]
  return f'{statistics.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})'


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A Markdown table of `rows` under `header`."""
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  return '\n'.join(lines + ['| ' + ' | '.join(map(str, row)) + ' |' for row in rows])


def report(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]], *lines: str) -> None:
  """Prints `title` (unless empty), the table of `rows` under `header`, then `lines`."""
  print('\n'.join([*([title] if title else []), table(header, rows), *lines]))


def mode_flag(parser, owners: dict[str, str], owner: str, flag: str, **kwargs) -> None:
  """A flag of one mode (`owner`: how the mode is chosen, e.g. '--mode epoch'), its help saying
  so; `owners` collects {dest: owner} for refuse_other_modes."""
  note = ' (default %(default)s)' if 'default' in kwargs else ''
  kwargs['help'] = f'{owner}: {kwargs["help"]}{note}'
  owners[parser.add_argument(flag, **kwargs).dest] = owner


def mode_flags(parser, table) -> dict[str, str]:
  """Each (mode, flag, type, default, help) of `table` added by mode_flag; {dest: mode}."""
  owners: dict[str, str] = {}
  for mode, flag, kind, default, text in table:
    mode_flag(parser, owners, mode, flag, type=kind, default=default, help=text)
  return owners


def refuse_other_modes(parser, args, owners: dict[str, str], chosen: str) -> None:
  """A flag of another mode than `chosen` given (not at its default): one line, exit 2."""
  for dest, owner in owners.items():
    if owner != chosen and getattr(args, dest) != parser.get_default(dest):
      fail(f'--{dest.replace("_", "-")} belongs to {owner}: choose it, or leave the flag out')


# The step benchmarks' config: `--config FILE[:ARGS]` as train.py takes it (default: the CelebA
# study's model and numerics at 64^2, batch 64), then the shorthand flags, then --config.* flags.
DEFAULT_CONFIG = 'configs/celeba.py:data.image_size=64,batch_size=64'
SHORTHANDS = (  # (argparse dest, the config field it sets, type, help: None for a second field)
  ('image_size', 'data.image_size', int, 'data.image_size'),
  ('batch', 'batch_size', int, 'batch_size (global)'),
  ('width', 'model.width', float, 'model.width'),
  ('stem', 'model.stem', str, "model.stem: 'imagenet' or 'small'"),
  ('compute_dtype', 'numerics.compute_dtype', str, 'numerics.compute_dtype'),
  ('matmul_precision', 'numerics.matmul_precision', str, 'numerics.matmul_precision'),
  ('profile', 'numerics.profile', str, 'numerics.profile (numerics/formats.py)'),
  ('format', 'numerics.conv_format', str, 'numerics.conv_format and numerics.dense_format'),
  ('format', 'numerics.dense_format', str, None),
  ('emulate_impl', 'numerics.emulate_impl', str, 'numerics.emulate_impl: auto, reference or fast'),
  ('conv_impl', 'numerics.conv_impl', str, 'numerics.conv_impl: auto, xla or im2col'),
  ('prefetch', 'data.prefetch', int, 'data.prefetch (batches prepared ahead)'),
  ('flip', 'data.flip', None, 'data.flip'),
)


def add_step_args(parser) -> None:
  """The shorthand config flags (default: the config's value) and the timing flags."""
  parser.epilog = (
    f'--config FILE[:ARGS] (default {DEFAULT_CONFIG}) and --config.FIELD=VALUE overrides as '
    'train.py takes them; each shorthand flag sets one field, checked as train.py checks it.'
  )
  for dest, _, kind, text in SHORTHANDS:
    flag = '--' + dest.replace('_', '-')
    if kind is None:
      parser.add_argument(flag, action='store_true', default=None, help=text)
    elif text:
      parser.add_argument(flag, type=kind, help=text)
  parser.add_argument('--num-classes', type=int, default=1000, help='classes of the synthetic data')
  parser.add_argument('--steps', type=int, default=10, help='steps per timed window')
  parser.add_argument('--windows', type=int, default=5, help='timed windows (median reported)')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps after compiling')
  parser.add_argument('--devices', type=int, default=0, help='use the first N devices (0: all)')


def parse_step_config(parser, argv, resolve=True):
  """(args, config) of `argv`: --config, the shorthand flags, then --config.* loaded, resolved,
  numerics applied before any backend starts (`resolve(args)` False: as loaded). Bad: exit 2."""
  spec, overrides, rest = config_common.split_argv(list(sys.argv[1:] if argv is None else argv))
  args = parser.parse_args(rest)  # --help and a bad flag end here, before JAX loads
  from numerics import setup as numerics_setup

  given = [(f, getattr(args, d)) for d, f, _, _ in SHORTHANDS if getattr(args, d) is not None]
  try:
    loaded = config_common.load(spec or DEFAULT_CONFIG, given + overrides)
    config = validation.resolve(loaded)
    numerics_setup.configure(config)
  except ValueError as e:  # a bad file, field or value (ConfigError is a ValueError): one line
    fail(str(e))
  return args, (config if resolve is True or resolve(args) else loaded)
