"""Compile a config's TPU programs on a host without a TPU, before renting one.

  python -m sweeps.preflight --config=configs/celeba.py:tpu --topology v4-8 v5e-8 v5p-8 v6e-8 \
      --out runs/preflight
  python -m sweeps.preflight --config=configs/digits.py:study --topology v5e:2x4 --max-batch

`--config` is train.py's (presets, `--config.<field>=<value>` overrides, the same checks and
one-line errors: configs/loader.py, trainer/validation.resolve). For each `--topology`
(sweeps/tpu_topology.py: libtpu names such as v5e:2x4 or v4:2x2x1, or accelerator types such as
v5e-8) it builds the trainer's own run context for that topology's compile-only devices, one data
axis over all of them as a run of that size would use (trainer/run.py `build`), from the dataset
the config declares (trainer/declared.py: no data on this host), lowers the training step of
every phase (frozen and unfrozen) and the evaluation step on the abstract state and batches
(`run.abstract_state`, `run.abstract_batch`) and compiles them with libtpu. Per topology and
program it reports:

  compiled          or the compiler's one-line reason (e.g. a program over the chip's memory)
  memory_per_chip   arguments + outputs - aliased (the donated state) + temporaries + generated
                    code (`memory_analysis()`), against the chip's HBM: `fits`
  gflop_per_step    XLA's FLOPs of the whole step (one chip's program x chips); bytes per chip
  roofline          step time, images/s, hours of a run and of the config's sweep
                    (sweeps/tpu_estimate.py: optimistic, from the chip's bf16 peak and HBM
                    bandwidth, sources in sweeps/tpu_topology.py)
  numerics          every dot and convolution of the optimized TPU program, forward and backward,
                    with the operand types and precision it carries (sweeps/hlo_census.py), how
                    many carry what the config asks (`products_as_configured`), and the emulated
                    formats' rounding operations that survived compilation (`rounding_ops`)
  max_batch         with --max-batch: the largest global batch whose unfrozen training step fits
                    a chip (compiled: doubling, then bisection on multiples of the devices)

It writes OUT/preflight.csv (one row per topology x program) and prints a Markdown table. A
compiled program is not an execution: this proves the program compiles for the topology with its
sharding, how much memory it needs and which precision the compiler kept; it says nothing of the
numbers a TPU would compute, nor of the speed it would reach. Exit code 2 on bad input (and
without libtpu), 1 if a program did not compile, else 0.
"""

import argparse
import os
import re
import sys
import threading
import time

from configs import loader
from sweeps import hlo_census, tpu_estimate, tpu_topology
from trainer import validation

GIB = 2**30
COLUMNS = ('topology', 'accelerator', 'chips', 'hosts', 'devices', 'phase', 'batch', 'compiled',
           'reason', 'compile_s', 'memory_per_chip_gib', 'argument_gib', 'output_gib',
           'alias_gib', 'temp_gib', 'code_gib', 'hbm_per_chip_gib', 'fits', 'gflop_per_step',
           'gbyte_per_chip', 'mxu_passes', 'roofline_ms', 'images_per_s', 'products',
           'products_as_configured', 'configured', 'rounding_ops', 'product_breakdown',
           'run_hours', 'sweep_runs', 'sweep_hours', 'max_batch')
HEARTBEAT_S = 30
PROGRAMS = ('frozen', 'full', 'eval')  # trainer/optim.py phase names, and the evaluation
# The compiler's out-of-memory refusal names the memory the program needs first (XLA prints
# binary units: G = GiB), e.g. 'HLO temporaries (63.55G) exceeds available HBM (15.75G)'.
EXHAUSTED = re.compile(r'RESOURCE_EXHAUSTED.*?([0-9.]+)([KMGT])\b')
UNITS_GIB = {'K': 2**-20, 'M': 2**-10, 'G': 1, 'T': 2**10}


def parse_args(rest):
  p = argparse.ArgumentParser(prog='python -m sweeps.preflight',
                              description=__doc__.split('\n')[0],
                              epilog='and --config=FILE[:PRESETS,key=value] [--config.<field>=<value> '
                                     '...] as train.py takes them (configs/loader.py)')
  p.add_argument('--topology', nargs='+', required=True,
                 help='TPU topologies: libtpu names (v5e:2x4, v4:2x2x1, v5p:2x2x1, v6e:2x2) or '
                      'accelerator types (v4-8, v5e-8, v5p-8, v6e-8)')
  p.add_argument('--out', default=None, help='folder for preflight.csv (default: none written)')
  p.add_argument('--programs', nargs='+', choices=PROGRAMS, default=list(PROGRAMS),
                 help='which programs to compile (default all: the frozen and the full training '
                      'phase, where the config has them, and the evaluation)')
  p.add_argument('--max-batch', action='store_true',
                 help='also search the largest global batch that fits a chip (more compiles)')
  p.add_argument('--max-compiles', type=int, default=6,
                 help='compiles the --max-batch search may spend per topology')
  return p.parse_args(rest)


class Heartbeat:
  """Prints `label` and the seconds elapsed every HEARTBEAT_S while a compile runs."""

  def __init__(self, label):
    self.label, self.done = label, threading.Event()

  def __enter__(self):
    self.start = time.time()
    threading.Thread(target=self._beat, daemon=True).start()
    return self

  def _beat(self):
    while not self.done.wait(HEARTBEAT_S):
      print(f'[preflight]   ... {self.label}: still compiling, {time.time() - self.start:.0f} s',
            flush=True)

  def __exit__(self, *exc):
    self.done.set()


def compile_program(fn, args, label):
  """(compiled executable or None, seconds, one-line reason or '')."""
  start = time.time()
  with Heartbeat(label):
    try:
      compiled = fn.lower(*args).compile()
    except Exception as e:  # pylint: disable=broad-except  # the compiler's refusal, as one line
      lines = [l.strip() for l in str(e).splitlines() if l.strip()]
      return None, time.time() - start, (lines[0] if lines else type(e).__name__)[:300]
  return compiled.fn, time.time() - start, ''


def programs(ctx):
  """[(phase name, jitted step, abstract args, images per step)]: every training phase's step
  (entered at its first step, as a run enters it) and the evaluation step."""
  import jax  # pylint: disable=import-outside-toplevel
  from trainer import run, steps  # pylint: disable=import-outside-toplevel
  config, state, out = ctx.config, run.abstract_state(ctx), []
  train_batch = run.abstract_batch(ctx, ctx.dataset.train, config.batch_size)
  for phase in ctx.phases:
    state, step_fn = run.enter_phase(ctx, state, phase, phase.start)
    out.append((phase.name, step_fn, (state, train_batch), config.batch_size))
  totals = run.replicate(ctx, jax.eval_shape(
      lambda: jax.tree.map(lambda v: jax.numpy.asarray(v, 'float32'), steps.ZERO_SUMS)))
  eval_batch = run.abstract_batch(ctx, ctx.dataset.test, config.eval_batch_size, mask=True)
  out.append(('eval', run.eval_step(ctx, state), (state, eval_batch, totals),
              config.eval_batch_size))
  return out


def memory(compiled):
  """{memory_per_chip_gib and its parts} of a compiled program (module doc)."""
  m = compiled.memory_analysis()
  parts = {'argument_gib': m.argument_size_in_bytes, 'output_gib': m.output_size_in_bytes,
           'alias_gib': m.alias_size_in_bytes, 'temp_gib': m.temp_size_in_bytes,
           'code_gib': m.generated_code_size_in_bytes}
  total = (parts['argument_gib'] + parts['output_gib'] - parts['alias_gib'] + parts['temp_gib']
           + parts['code_gib'])
  return {'memory_per_chip_gib': total / GIB, **{k: v / GIB for k, v in parts.items()}}


def program_row(compiled, config, chip, facts, images):
  """The measured columns of one compiled program (module doc)."""
  cost = compiled.cost_analysis()
  flops, accessed = float(cost.get('flops', 0.0)), float(cost.get('bytes accessed', 0.0))
  text = compiled.as_text()
  found = hlo_census.products(text)
  passes = hlo_census.mean_passes(found)
  step_s = tpu_estimate.roofline_s(flops, accessed, passes, chip)
  row = memory(compiled)
  row.update(fits=row['memory_per_chip_gib'] <= chip.hbm_gib,
             gflop_per_step=flops * facts['devices'] / 1e9, gbyte_per_chip=accessed / 1e9,
             mxu_passes=passes, roofline_ms=step_s * 1e3, images_per_s=images / step_s,
             products=len(found), products_as_configured=hlo_census.as_configured(found, config),
             configured='; '.join(f'{k} @ {hlo_census.configured(config, k)}'
                                  for k in ('conv', 'dense')),
             rounding_ops=hlo_census.rounding_ops(text),
             product_breakdown=hlo_census.breakdown(found))
  return row, step_s


def build_context(config, topology, devs):
  """The run context of `config` on the topology's devices, from the declared dataset."""
  from trainer import declared, run  # pylint: disable=import-outside-toplevel
  chip = tpu_topology.CHIPS[topology.version]
  dataset = declared.dataset(config)
  validation.check_dataset(config, dataset, chip.hbm_gib * GIB)
  return run.build(config, dataset, devs, device_bytes=chip.hbm_gib * GIB)


def refused_memory(reason, config, devices):
  """GiB per chip a refused program needs, where the refusal is about memory, else None: the
  compiler's out-of-memory message (EXHAUSTED), or trainer/validation.py's lower bound of a
  training step's activations when that is what refused the batch."""
  found = EXHAUSTED.search(reason)
  if found:
    return float(found.group(1)) * UNITS_GIB[found.group(2)]
  if 'of activations' in reason:
    return validation.activation_bytes(config, config.batch_size // devices) / GIB
  return None


def program_rows(config, ctx, head, chip, facts, wanted):
  """(rows, {program: roofline step_s}) of the `wanted` programs of `ctx`, compiled."""
  rows, step_s = [], {}
  for name, fn, args, images in programs(ctx):
    if name not in wanted:
      continue
    label = f'{head["topology"]} {name} (batch {images})'
    print(f'[preflight]   compiling {label}', flush=True)
    compiled, seconds, reason = compile_program(fn, args, label)
    row = {**head, 'phase': name, 'batch': images, 'compiled': compiled is not None,
           'reason': reason, 'compile_s': round(seconds, 1)}
    if compiled is not None:
      measured, step_s[name] = program_row(compiled, config, chip, facts, images)
      row.update(measured)
    elif refused_memory(reason, config, facts['devices']) is not None:
      row.update(memory_per_chip_gib=refused_memory(reason, config, facts['devices']), fits=False)
    rows.append(row)
    print(f'[preflight]   {name}: {summary(row)}', flush=True)
  return rows, step_s


def topology_rows(config, topology, devs, runs, wanted=PROGRAMS):
  """(rows, run context) of the `wanted` programs of `config` on `topology`; a single row with
  the reason (and no context) when the run cannot be built there, e.g. a batch that does not
  split over its devices."""
  chip, facts = tpu_topology.CHIPS[topology.version], tpu_topology.facts(topology, devs)
  head = {'topology': topology.name, 'accelerator': facts['device_kind'], 'chips': facts['chips'],
          'hosts': facts['hosts'], 'devices': facts['devices'], 'hbm_per_chip_gib': chip.hbm_gib,
          'sweep_runs': runs}
  print(f'[preflight] {topology.name}: {facts["devices"]} x {facts["device_kind"]} '
        f'({facts["chips"]} chips, {facts["hosts"]} host(s))', flush=True)
  try:
    ctx = build_context(config, topology, devs)
  except validation.ConfigError as e:
    reason = str(e).splitlines()[0]
    row = {**head, 'phase': '-', 'batch': config.batch_size, 'compiled': False, 'reason': reason}
    needed = refused_memory(reason, config, facts['devices'])
    if needed is not None:
      row.update(memory_per_chip_gib=needed, fits=False)
    print(f'[preflight]   cannot build the run there: {reason}', flush=True)
    return [row], None
  rows, step_s = program_rows(config, ctx, head, chip, facts, wanted)
  seconds = tpu_estimate.run_seconds(ctx, step_s)
  for row in rows:
    if seconds is not None:
      row.update(run_hours=seconds / 3600, sweep_hours=runs * seconds / 3600)
  return rows, ctx


def summary(row):
  """One progress line for a program's row."""
  if not row['compiled']:
    needs = (f' (needs {row["memory_per_chip_gib"]:.3g} GiB per chip, {row["hbm_per_chip_gib"]} '
             'GiB of HBM: does not fit)' if row.get('memory_per_chip_gib') is not None else '')
    return f'NOT compiled after {row["compile_s"]} s: {row["reason"]}{needs}'
  return (f'compiled in {row["compile_s"]} s: {row["memory_per_chip_gib"]:.3g} of '
          f'{row["hbm_per_chip_gib"]} GiB per chip ({"fits" if row["fits"] else "DOES NOT FIT"}), '
          f'{row["gflop_per_step"]:.4g} GFLOP per step, roofline {row["roofline_ms"]:.3g} ms '
          f'({row["images_per_s"]:,.0f} images/s), {row["products"]} products '
          f'({row["products_as_configured"]} as configured: {row["configured"]}), '
          f'{row["rounding_ops"]} rounding ops')


def max_batch(spec, overrides, topology, devs, config, max_compiles):
  """(largest global batch whose unfrozen training step fits a chip, compiles spent): the search
  of tpu_estimate.largest_batch on multiples of devices x BatchNorm group, up to the training
  split. A batch the run cannot be built with (trainer/validation.py: e.g. its activations'
  lower bound over the chip's memory) does not fit, without compiling."""
  from trainer import declared  # pylint: disable=import-outside-toplevel
  chip = tpu_topology.CHIPS[topology.version]
  unit = len(devs) * max(1, config.numerics.batchnorm_group)
  limit = len(declared.dataset(config).train) // unit * unit

  def fits(batch):
    try:
      candidate = validation.resolve(loader.load(spec, list(overrides) + [('batch_size',
                                                                            str(batch))]))
      ctx = build_context(candidate, topology, devs)
    except ValueError:
      return False
    name, fn, args, _ = next(p for p in programs(ctx)
                             if p[0] == next(ph.name for ph in ctx.phases if not ph.frozen))
    label = f'{topology.name} {name} at batch {batch} (--max-batch)'
    print(f'[preflight]   compiling {label}', flush=True)
    compiled, seconds, reason = compile_program(fn, args, label)
    gib = memory(compiled)['memory_per_chip_gib'] if compiled is not None else None
    ok = gib is not None and gib <= chip.hbm_gib
    print(f'[preflight]   batch {batch}: ' + (f'{gib:.3g} GiB per chip, {"fits" if ok else "does not fit"}'
                                             if gib is not None else f'not compiled: {reason}')
          + f' ({seconds:.0f} s)', flush=True)
    return ok
  return tpu_estimate.largest_batch(fits, config.batch_size, unit, limit, max_compiles)


def sweep_runs(spec):
  """How many runs the config file's get_sweep(arg) declares (1 without one)."""
  path, arg = loader.split_spec(spec)
  module = loader.load_module(path)
  if not hasattr(module, 'get_sweep'):
    return 1
  try:
    return len(module.get_sweep(arg or None))
  except Exception as e:  # pylint: disable=broad-except  # the config file's own code failed
    raise ValueError(f'--config={spec}: get_sweep() fails ({type(e).__name__}: {e})') from None


def markdown(rows):
  """The rows as a Markdown table, then one line per topology: run and sweep hours, max batch."""
  lines = ['| topology | chips (hosts) | program | compiled | GiB per chip (HBM) | fits | '
           'GFLOP/step | roofline ms | images/s | products (as configured) | rounding ops |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    if not r['compiled']:
      needs = r.get('memory_per_chip_gib')
      memory = f'{needs:.3g} ({r["hbm_per_chip_gib"]}) | NO' if needs is not None else ' |'
      lines.append(f'| {r["topology"]} | {r["chips"]} ({r["hosts"]}) | {r["phase"]} | no: '
                   f'{r["reason"]} | {memory} | | | | | |')
      continue
    lines.append(
        f'| {r["topology"]} | {r["chips"]} ({r["hosts"]}) | {r["phase"]} | yes | '
        f'{r["memory_per_chip_gib"]:.3g} ({r["hbm_per_chip_gib"]}) | {"yes" if r["fits"] else "NO"} '
        f'| {r["gflop_per_step"]:.4g} | {r["roofline_ms"]:.3g} | {r["images_per_s"]:,.0f} | '
        f'{r["products"]} ({r["products_as_configured"]}) | {r["rounding_ops"]} |')
  lines.append('')
  for name in dict.fromkeys(r['topology'] for r in rows):
    first = next(r for r in rows if r['topology'] == name)
    hours = (f'a run {first["run_hours"]:.3g} h, the sweep ({first["sweep_runs"]} runs) '
             f'{first["sweep_hours"]:.3g} h at the roofline' if first.get('run_hours') is not None
             else 'no run estimate (it needs every program compiled)')
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
    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update('jax_platforms', 'cpu')  # compile-only TPU devices; nothing runs on a TPU
    jax.config.update('jax_enable_compilation_cache', False)  # every program compiled here, timed
    from numerics import setup as numerics_setup  # pylint: disable=import-outside-toplevel
    numerics_setup.configure(config)
    devices = [tpu_topology.devices(t) for t in topologies]
  except ValueError as e:
    print(f'error: {str(e).splitlines()[0]}', file=sys.stderr)
    return 2
  rows = []
  for topology, devs in zip(topologies, devices):
    found, ctx = topology_rows(config, topology, devs, runs, args.programs)
    if args.max_batch and ctx is not None:
      largest, spent = max_batch(spec, overrides, topology, devs, config, args.max_compiles)
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
  print(f'[preflight] took {time.time() - start:.0f} s on this host ({os.cpu_count()} CPUs): '
        'compiled programs, not executions; the roofline is an optimistic step time')
  return 0 if all(r['compiled'] for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
