"""Compile a config's TPU programs on a host without a TPU, before renting one.

  python -m sweeps.preflight --config=configs/celeba.py:tpu --topology v4-8 v5e-8 v5p-8 v6e-8 \
      --out runs/preflight
  python -m sweeps.preflight --config=configs/digits.py:study --topology v5e:2x4 --max-batch

`--config` is train.py's (the same checks and one-line errors: configs/validation.py). For each
`--topology` it builds the trainer's own run context for the topology's compile-only devices from
the dataset's declared sizes (input_pipeline/registry.py `declared`: no data here), compiles every
training phase's step and the evaluation step with libtpu (sweeps/tpu_programs.py), and reports
per program whether it compiled, its memory per chip against the HBM, XLA's FLOPs and bytes, a
roofline time (sweeps/tpu_estimate.py), the precision every product carries (sweeps/hlo_census.py)
and, with --max-batch, the largest batch that fits. It writes OUT/preflight.csv and prints a
Markdown table. A compiled program is not an execution: docs/tpu.md ("Before renting: the
preflight") says what this proves and what it cannot. Exit code 2 on bad input (and without
libtpu), 1 if a program did not compile, else 0.
"""

import os
import sys
import time

from analysis import cli
from configs import loader
from sweeps import tpu_topology

# The compiling side (sweeps/tpu_programs.py: JAX, the trainer, the census) is imported once the
# command line is read: --help and a bad flag are answered before any of it loads.

COLUMNS = (
  'topology',
  'accelerator',
  'chips',
  'hosts',
  'devices',
  'phase',
  'batch',
  'compiled',
  'reason',
  'compile_s',
  'memory_per_chip_gib',
  'argument_gib',
  'output_gib',
  'alias_gib',
  'temp_gib',
  'code_gib',
  'hbm_per_chip_gib',
  'fits',
  'gflop_per_step',
  'gbyte_per_chip',
  'mxu_passes',
  'roofline_ms',
  'images_per_s',
  'products',
  'products_as_configured',
  'configured',
  'rounding_ops',
  'product_breakdown',
  'run_hours',
  'sweep_runs',
  'sweep_hours',
  'max_batch',
)
PROGRAMS = ('frozen', 'full', 'eval')  # trainer/optim.py phase names, and the evaluation


def parse_args(rest):
  p = cli.Parser(
    prog='python -m sweeps.preflight',
    description=__doc__.split('\n')[0],
    epilog='and --config=FILE[:PRESETS,key=value] [--config.<field>=<value> '
    '...] as train.py takes them (configs/loader.py)',
  )
  p.add_argument(
    '--topology',
    nargs='+',
    required=True,
    help='TPU topologies: libtpu names (v5e:2x4, v4:2x2x1, v5p:2x2x1, v6e:2x2) or '
    'accelerator types (v4-8, v5e-8, v5p-8, v6e-8)',
  )
  p.add_argument('--out', default=None, help='folder for preflight.csv (default: none written)')
  p.add_argument(
    '--programs',
    nargs='+',
    choices=PROGRAMS,
    default=list(PROGRAMS),
    help='which programs to compile (default all: the frozen and the full training '
    'phase, where the config has them, and the evaluation)',
  )
  p.add_argument(
    '--max-batch',
    action='store_true',
    help='also search the largest global batch that fits a chip (more compiles)',
  )
  p.add_argument(
    '--max-compiles',
    type=int,
    default=6,
    help='compiles the --max-batch search may spend per topology',
  )
  return p.parse_args(rest)


def sweep_runs(spec):
  """How many runs the config file's get_sweep(arg) declares (1 without one)."""
  path, arg = loader.split_spec(spec)
  module = loader.load_module(path)
  if not hasattr(module, 'get_sweep'):
    return 1
  try:
    return len(module.get_sweep(arg or None))
  except Exception as e:  # the config file's own code failed
    raise ValueError(f'--config={spec}: get_sweep() fails ({type(e).__name__}: {e})') from None


def markdown(rows):
  """The rows as a Markdown table, then one line per topology: run and sweep hours, max batch."""
  lines = [
    '| topology | chips (hosts) | program | compiled | GiB per chip (HBM) | fits | '
    'GFLOP/step | roofline ms | images/s | products (as configured) | rounding ops |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    if not r['compiled']:
      needs = r.get('memory_per_chip_gib')
      memory = f'{needs:.3g} ({r["hbm_per_chip_gib"]}) | NO' if needs is not None else ' |'
      lines.append(
        f'| {r["topology"]} | {r["chips"]} ({r["hosts"]}) | {r["phase"]} | no: '
        f'{r["reason"]} | {memory} | | | | | |'
      )
      continue
    lines.append(
      f'| {r["topology"]} | {r["chips"]} ({r["hosts"]}) | {r["phase"]} | yes | '
      f'{r["memory_per_chip_gib"]:.3g} ({r["hbm_per_chip_gib"]}) | {"yes" if r["fits"] else "NO"} '
      f'| {r["gflop_per_step"]:.4g} | {r["roofline_ms"]:.3g} | {r["images_per_s"]:,.0f} | '
      f'{r["products"]} ({r["products_as_configured"]}) | {r["rounding_ops"]} |'
    )
  lines.append('')
  for name in dict.fromkeys(r['topology'] for r in rows):
    first = next(r for r in rows if r['topology'] == name)
    hours = (
      f'a run {first["run_hours"]:.3g} h, the sweep ({first["sweep_runs"]} runs) '
      f'{first["sweep_hours"]:.3g} h at the roofline'
      if first.get('run_hours') is not None
      else 'no run estimate (it needs every program compiled)'
    )
    largest = f'; largest batch that fits: {first["max_batch"]}' if first.get('max_batch') else ''
    lines.append(f'- {name}: {hours}{largest}')
  return '\n'.join(lines)


def prepare(argv):
  """(config, spec, overrides, args, topologies, runs) from the command line; ValueError (one
  line) on bad input, before anything is compiled or written."""
  spec, overrides, rest = loader.split_argv(argv)
  args = parse_args(rest)
  if not spec:
    raise ValueError('--config is required, e.g. --config=configs/digits.py:smoke')
  from configs import validation  # numpy: after --help

  config = validation.resolve(loader.load(spec, overrides))
  topologies = [tpu_topology.parse(name) for name in args.topology]
  if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
    raise ValueError(f'--out={args.out} is a file, not a folder: give a folder for preflight.csv')
  if args.max_compiles < 1:
    raise ValueError(f'--max-compiles={args.max_compiles}: give a positive number')
  missing = tpu_topology.libtpu_missing()
  if missing:
    raise ValueError(missing)
  return config, spec, overrides, args, topologies, sweep_runs(spec)


def main(argv=None):
  """Returns the exit code (module doc)."""
  start = time.time()
  argv = sys.argv[1:] if argv is None else argv
  try:
    config, spec, overrides, args, topologies, runs = prepare(argv)
    import jax

    from sweeps import tpu_estimate, tpu_programs

    jax.config.update('jax_platforms', 'cpu')  # compile-only TPU devices; nothing runs on a TPU
    jax.config.update('jax_enable_compilation_cache', False)  # every program compiled here, timed
    from numerics import setup as numerics_setup

    numerics_setup.configure(config)
    devices = [tpu_topology.devices(t) for t in topologies]
  except ValueError as e:
    print(f'error: {str(e).splitlines()[0]}', file=sys.stderr)
    return 2
  rows = []
  for topology, devs in zip(topologies, devices, strict=True):
    found, ctx = tpu_programs.topology_rows(config, topology, devs, runs, args.programs)
    if args.max_batch and ctx is not None:
      largest, spent = tpu_programs.max_batch(
        spec, overrides, topology, devs, config, args.max_compiles
      )
      print(f'[preflight]   largest batch that fits: {largest} ({spent} compiles)', flush=True)
      for row in found:
        row['max_batch'] = largest
    rows += found
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, 'preflight.csv')
    with open(path, 'w') as f:
      f.write(tpu_estimate.csv_text(rows, COLUMNS))
    print(f'[preflight] wrote {path}')
  print(markdown(rows))
  print(
    f'[preflight] took {time.time() - start:.0f} s on this host ({os.cpu_count()} CPUs): '
    'compiled programs, not executions; the roofline is an optimistic step time'
  )
  return 0 if all(r['compiled'] for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
