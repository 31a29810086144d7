"""The TPU programs of a run, compiled for a topology's compile-only devices, and what each
shows: memory per chip, XLA's cost, the roofline estimate and the numerics census (the rows of
sweeps/preflight.py; the columns: docs/tpu.md)."""

import re
import threading
import time

import jax

from configs import capacity, loader, validation
from input_pipeline import registry
from sweeps import hlo_census, tpu_estimate, tpu_topology
from trainer import run, steps

GIB = 2**30
HEARTBEAT_S = 30
# The compiler's out-of-memory refusal names the memory the program needs first (XLA prints
# binary units: G = GiB), e.g. 'HLO temporaries (63.55G) exceeds available HBM (15.75G)'.
EXHAUSTED = re.compile(r'RESOURCE_EXHAUSTED.*?([0-9.]+)([KMGT])\b')
UNITS_GIB = {'K': 2**-20, 'M': 2**-10, 'G': 1, 'T': 2**10}


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
      print(
        f'[preflight]   ... {self.label}: still compiling, {time.time() - self.start:.0f} s',
        flush=True,
      )

  def __exit__(self, *exc):
    self.done.set()


def compile_program(fn, args, label):
  """(compiled executable or None, seconds, one-line reason or '')."""
  start = time.time()
  with Heartbeat(label):
    try:
      compiled = fn.lower(*args).compile()
    except Exception as e:  # the compiler's refusal, as one line
      lines = [line.strip() for line in str(e).splitlines() if line.strip()]
      return None, time.time() - start, (lines[0] if lines else type(e).__name__)[:300]
  return compiled.fn, time.time() - start, ''


def programs(ctx):
  """[(phase name, jitted step, abstract args, images per step)]: every training phase's step
  (entered at its first step, as a run enters it) and the evaluation step."""
  config, state, out = ctx.config, run.abstract_state(ctx), []
  train_batch = run.abstract_batch(ctx, ctx.dataset.train, config.batch_size)
  for phase in ctx.phases:
    state, step_fn = run.enter_phase(ctx, state, phase, phase.start)
    out.append((phase.name, step_fn, (state, train_batch), config.batch_size))
  totals = run.replicate(
    ctx,
    jax.eval_shape(
      lambda: jax.tree.map(lambda v: jax.numpy.asarray(v, 'float32'), steps.ZERO_SUMS)
    ),
  )
  eval_batch = run.abstract_batch(ctx, ctx.dataset.test, config.eval_batch_size, mask=True)
  out.append(
    ('eval', run.eval_step(ctx, state), (state, eval_batch, totals), config.eval_batch_size)
  )
  return out


def memory(compiled):
  """{memory_per_chip_gib and its parts} of a compiled program (module doc)."""
  m = compiled.memory_analysis()
  parts = {
    'argument_gib': m.argument_size_in_bytes,
    'output_gib': m.output_size_in_bytes,
    'alias_gib': m.alias_size_in_bytes,
    'temp_gib': m.temp_size_in_bytes,
    'code_gib': m.generated_code_size_in_bytes,
  }
  total = (
    parts['argument_gib']
    + parts['output_gib']
    - parts['alias_gib']
    + parts['temp_gib']
    + parts['code_gib']
  )
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
  row.update(
    fits=row['memory_per_chip_gib'] <= chip.hbm_gib,
    gflop_per_step=flops * facts['devices'] / 1e9,
    gbyte_per_chip=accessed / 1e9,
    mxu_passes=passes,
    roofline_ms=step_s * 1e3,
    images_per_s=images / step_s,
    products=len(found),
    products_as_configured=hlo_census.as_configured(found, config),
    configured='; '.join(f'{k} @ {hlo_census.configured(config, k)}' for k in ('conv', 'dense')),
    rounding_ops=hlo_census.rounding_ops(text),
    product_breakdown=hlo_census.breakdown(found),
  )
  return row, step_s


def build_context(config, topology, devs):
  """The run context of `config` on the topology's devices, from the declared dataset (checked
  against the chip's memory there, as a run's is against its devices')."""
  chip = tpu_topology.CHIPS[topology.version]
  return run.build(config, registry.declared(config), devs, device_bytes=chip.hbm_gib * GIB)


def refused_memory(reason, config, devices):
  """GiB per chip a refused program needs, where the refusal is about memory, else None: the
  compiler's out-of-memory message (EXHAUSTED), or configs/capacity.py's lower bound of a
  training step's activations when that is what refused the batch."""
  found = EXHAUSTED.search(reason)
  if found:
    return float(found.group(1)) * UNITS_GIB[found.group(2)]
  if 'of activations' in reason:
    return capacity.activation_bytes(config, config.batch_size // devices) / GIB
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
    row = {
      **head,
      'phase': name,
      'batch': images,
      'compiled': compiled is not None,
      'reason': reason,
      'compile_s': round(seconds, 1),
    }
    if compiled is not None:
      measured, step_s[name] = program_row(compiled, config, chip, facts, images)
      row.update(measured)
    elif refused_memory(reason, config, facts['devices']) is not None:
      row.update(memory_per_chip_gib=refused_memory(reason, config, facts['devices']), fits=False)
    rows.append(row)
    print(f'[preflight]   {name}: {summary(row)}', flush=True)
  return rows, step_s


def topology_rows(config, topology, devs, runs, wanted):
  """(rows, run context) of the `wanted` programs of `config` on `topology`; a single row with
  the reason (and no context) when the run cannot be built there, e.g. a batch that does not
  split over its devices."""
  chip, facts = tpu_topology.CHIPS[topology.version], tpu_topology.facts(topology, devs)
  head = {
    'topology': topology.name,
    'accelerator': facts['device_kind'],
    'chips': facts['chips'],
    'hosts': facts['hosts'],
    'devices': facts['devices'],
    'hbm_per_chip_gib': chip.hbm_gib,
    'sweep_runs': runs,
  }
  print(
    f'[preflight] {topology.name}: {facts["devices"]} x {facts["device_kind"]} '
    f'({facts["chips"]} chips, {facts["hosts"]} host(s))',
    flush=True,
  )
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
    needs = (
      f' (needs {row["memory_per_chip_gib"]:.3g} GiB per chip, {row["hbm_per_chip_gib"]} '
      'GiB of HBM: does not fit)'
      if row.get('memory_per_chip_gib') is not None
      else ''
    )
    return f'NOT compiled after {row["compile_s"]} s: {row["reason"]}{needs}'
  return (
    f'compiled in {row["compile_s"]} s: {row["memory_per_chip_gib"]:.3g} of '
    f'{row["hbm_per_chip_gib"]} GiB per chip ({"fits" if row["fits"] else "DOES NOT FIT"}), '
    f'{row["gflop_per_step"]:.4g} GFLOP per step, roofline {row["roofline_ms"]:.3g} ms '
    f'({row["images_per_s"]:,.0f} images/s), {row["products"]} products '
    f'({row["products_as_configured"]} as configured: {row["configured"]}), '
    f'{row["rounding_ops"]} rounding ops'
  )


def max_batch(spec, overrides, topology, devs, config, max_compiles):
  """(largest global batch whose unfrozen training step fits a chip, compiles spent): the search
  of tpu_estimate.largest_batch on multiples of devices x BatchNorm group, up to the training
  split. A batch the run cannot be built with (configs/validation.py: e.g. its activations'
  lower bound over the chip's memory) does not fit, without compiling."""
  chip = tpu_topology.CHIPS[topology.version]
  unit = len(devs) * max(1, config.numerics.batchnorm_group)
  limit = len(registry.declared(config).train) // unit * unit

  def fits(batch):
    try:
      candidate = validation.resolve(
        loader.load(spec, list(overrides) + [('batch_size', str(batch))])
      )
      ctx = build_context(candidate, topology, devs)
    except ValueError:
      return False
    name, fn, args, _ = next(
      p for p in programs(ctx) if p[0] == next(ph.name for ph in ctx.phases if not ph.frozen)
    )
    label = f'{topology.name} {name} at batch {batch} (--max-batch)'
    print(f'[preflight]   compiling {label}', flush=True)
    compiled, seconds, reason = compile_program(fn, args, label)
    gib = memory(compiled)['memory_per_chip_gib'] if compiled is not None else None
    ok = gib is not None and gib <= chip.hbm_gib
    print(
      f'[preflight]   batch {batch}: '
      + (
        f'{gib:.3g} GiB per chip, {"fits" if ok else "does not fit"}'
        if gib is not None
        else f'not compiled: {reason}'
      )
      + f' ({seconds:.0f} s)',
      flush=True,
    )
    return ok

  return tpu_estimate.largest_batch(fits, config.batch_size, unit, limit, max_compiles)
