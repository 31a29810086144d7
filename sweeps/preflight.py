"""Compile a config's TPU programs on a host without a TPU, before renting one.
Per topology and program: memory per chip, XLA cost, roofline time, precisions (docs/tpu.md)."""

import collections
import contextlib
import csv
import math
import os
import re
import sys
import time

import input_pipeline
from analysis import analyse as cli
from configs import common, validation
from numerics import formats
from runrecord import files
from sweeps import tpu

# JAX, libtpu and the trainer load once the command line is read.

COLUMNS = tuple(
  'topology accelerator chips hosts devices phase batch compiled reason compile_s '
  'memory_per_chip_gib argument_gib output_gib alias_gib temp_gib code_gib hbm_per_chip_gib fits '
  'gflop_per_step gbyte_per_chip mxu_passes roofline_ms images_per_s products '
  'products_as_configured configured rounding_ops product_breakdown startup_s compilation_s '
  'steps_s evaluation_s checkpoints_s feed_s run_hours sweep_runs sweep_hours max_batch'.split()
)
PROGRAMS = ['frozen', 'full', 'eval']  # trainer/run.py phase names, and the evaluation
GIB = 2**30
HEARTBEAT_S = 30
# The compiler's out-of-memory refusal names the memory the program needs first (XLA prints
# binary units: G = GiB), e.g. 'HLO temporaries (63.55G) exceeds available HBM (15.75G)'.
EXHAUSTED = re.compile(r'RESOURCE_EXHAUSTED.*?([0-9.]+)([KMGT])\b')
UNITS_GIB = {'K': 2**-20, 'M': 2**-10, 'G': 1, 'T': 2**10}


def parse_args(rest):
  p = cli.Parser(
    prog='python -m sweeps.preflight',
    description=__doc__.split('\n')[0],
    epilog="and train.py's --config=FILE[:PRESETS] [--config.<field>=<value> ...]",
  )
  p.add_argument('--topology', nargs='+', required=True, help='v5e:2x4 (libtpu) or v5e-8 (GCP)')
  p.add_argument('--out', help='folder for preflight.csv (default: none written)')
  p.add_argument('--programs', nargs='+', choices=PROGRAMS, default=PROGRAMS, help='(default: all)')
  p.add_argument('--max-batch', action='store_true', help='also search the largest batch that fits')
  p.add_argument('--max-compiles', type=int, default=6, help='compiles the search may spend')
  return p.parse_args(rest)


# --- the census: what a compiled program's optimized HLO says about its numerics (docs/tpu.md) ---
INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*')
ARRAY_TYPE = re.compile(r'^([a-z]+[0-9]*)\[([0-9,]*)\]')
OPCODE = re.compile(r'\s*([a-z][\w\-]*)\(')
OP_NAME = re.compile(r'op_name="([^"]*)"')
PRECISION = re.compile(r'operand_precision=\{([a-z,]+)\}')
ALGORITHM = re.compile(r'algorithm=([\w]+)')
DIM_LABELS = re.compile(r'dim_labels=([\w]+)_([\w]+)->([\w]+)')
LHS_CONTRACTING = re.compile(r'lhs_contracting_dims=\{([0-9,]*)\}')
# MXU passes of one product of f32 operands on a TPU (JAX's lax.Precision and DotAlgorithmPreset
# documentation: DEFAULT one bf16 pass, HIGH three, HIGHEST six); bf16 operands take one.
PASSES = {'default': 1, 'high': 3, 'highest': 6}
ALGORITHM_PASSES = re.compile(r'_x(\d+)$')
# The bf16 DotAlgorithmPresets and the precision level of the same passes: the TPU compiler may
# print a dot's algorithm as that level once it has rewritten the dot as a convolution.
SAME_PASSES = {'dot_bf16_bf16_f32' + (f'_x{n}' if n > 1 else ''): p for p, n in PASSES.items()}


class Product(
  collections.namedtuple('Product', 'kind direction operands precision algorithm flops')
):
  """One dot or convolution of the optimized HLO (the census: docs/tpu.md)."""

  @property
  def how(self):  # the precision it carries, or its algorithm where one is set
    return self.algorithm or self.precision


def split_type(rest):
  if not rest.startswith('('):
    return rest.partition(' ')[::2]  # (type text, the rest)
  depth = 0
  for i, c in enumerate(rest):
    depth += {'(': 1, ')': -1}.get(c, 0)
    if depth == 0:
      return rest[: i + 1], rest[i + 1 :]
  return rest, ''


def instructions(text):
  """[(name, type text, opcode, line)] of every instruction of an HLO module's text."""
  out = []
  for line in text.splitlines():
    head = INSTRUCTION.match(line)
    if head:
      type_text, after = split_type(line[head.end() :])
      opcode = OPCODE.match(after)
      if opcode:
        out.append((head.group(1), type_text, opcode.group(1), line))
  return out


def array_type(type_text):
  """(element type, dimensions) of an array type such as 'f32[16,8]{1,0:T(8,128)}'."""
  found = ARRAY_TYPE.match(type_text)
  if not found:
    return None, ()
  return found.group(1), tuple(int(d) for d in found.group(2).split(',') if d)


def operand_names(line, opcode):
  inside = line.split(f' {opcode}(', 1)[1].split(')', 1)[0]
  return [name.strip().lstrip('%') for name in inside.split(',')][:2]


def product_flops(opcode, line, out_dims, operand_dims):
  """2 x output elements x multiply-adds per output element; 0 if unreadable."""
  if opcode == 'convolution':
    labels, rhs = DIM_LABELS.search(line), operand_dims[1]
    if not labels or len(labels.group(2)) != len(rhs):
      return 0
    per_output = math.prod(d for d, label in zip(rhs, labels.group(2), strict=True) if label != 'o')
  else:
    contracting, lhs = LHS_CONTRACTING.search(line), operand_dims[0]
    dims = [int(d) for d in contracting.group(1).split(',') if d] if contracting else []
    per_output = math.prod(lhs[d] for d in dims if d < len(lhs))
  return 2 * math.prod(out_dims) * per_output


def products(text):
  """[Product] of every dot and convolution in the HLO module `text`."""
  listed = instructions(text)
  types = {name: type_text for name, type_text, _, _ in listed}
  out = []
  for _, type_text, opcode, line in listed:
    if opcode not in ('convolution', 'dot'):
      continue
    operands = [array_type(types.get(n, '')) for n in operand_names(line, opcode)]
    precision, algorithm = PRECISION.search(line), ALGORITHM.search(line)
    op_name = OP_NAME.search(line)
    op_name = op_name.group(1) if op_name else ''
    primitive = op_name.rsplit('/', 1)[-1]
    out.append(
      Product(
        {'conv_general_dilated': 'conv', 'dot_general': 'dense'}.get(primitive, 'other'),
        'backward' if 'transpose(' in op_name else 'forward',
        tuple(t or '?' for t, _ in operands),
        ','.join(sorted(set(precision.group(1).split(','))) if precision else ['default']),
        algorithm.group(1) if algorithm else '',
        product_flops(opcode, line, array_type(type_text)[1], [d for _, d in operands]),
      )
    )
  return out


def rounding_ops(text):
  """The emulated formats' roundings: reduce-precisions and bitcast-converts of f32 to u32."""
  listed = instructions(text)
  types = {name: type_text for name, type_text, _, _ in listed}
  count = 0
  for _, type_text, opcode, line in listed:
    if opcode == 'reduce-precision':
      count += 1
    elif opcode == 'bitcast-convert' and array_type(type_text)[0] == 'u32':
      source = operand_names(line, opcode)[0]
      count += array_type(types.get(source, ''))[0] == 'f32'
  return count


def breakdown(found):
  """'conv forward f32 x f32 @ highest: 20; ...': the products grouped, in a stable order."""
  groups = collections.Counter((p.kind, p.direction, ' x '.join(p.operands), p.how) for p in found)
  return '; '.join(f'{k} {d} {ops} @ {how}: {n}' for (k, d, ops, how), n in sorted(groups.items()))


def passes(product):
  """The MXU passes `product` takes on a TPU (PASSES; an algorithm's _xN; f32_f32_f32: 6)."""
  if all(t == 'bf16' for t in product.operands):
    return 1
  if product.algorithm:
    found = ALGORITHM_PASSES.search(product.algorithm)
    return int(found.group(1)) if found else (6 if 'f32_f32_f32' in product.algorithm else 1)
  return max(PASSES.get(level, 1) for level in product.precision.split(','))


def mean_passes(found):
  """The FLOP-weighted mean of `passes` (1.0 without products)."""
  total = sum(p.flops for p in found)
  return sum(p.flops * passes(p) for p in found) / total if total else 1.0


def configured(config, kind):
  """The Product.how `config` asks of its `kind` products: a native product's precision flag (a
  DotAlgorithmPreset: dots carry it, convolutions the default), an emulated one's computation."""
  from numerics import ops

  n, fmt = config.numerics, formats.kind_formats(config.numerics)[kind]
  if fmt == formats.NATIVE:
    flag = n.matmul_precision
    if flag in formats.PRESET_PRECISIONS:
      return 'default' if kind == 'conv' else f'dot_{flag.lower()}'
    return formats.LEGACY_LEVEL[flag]
  if ops.resolve_impl(n.emulate_impl, 'tpu', fmt) == 'fast':
    return ops.fast_plan(fmt, 'tpu').precision.lower()
  return 'highest'


def as_configured(found, config):
  """How many of `found` carry what `configured` asks of their kind (or its SAME_PASSES level)."""
  wanted = {kind: configured(config, kind) for kind in formats.KINDS}
  wanted = {kind: SAME_PASSES.get(how, how) for kind, how in wanted.items()}
  return sum(SAME_PASSES.get(p.how, p.how) == wanted.get(p.kind) for p in found)


# --- the programs of a run, compiled for a topology ---
def compile_program(fn, args, label):
  """(compiled executable or None, seconds, the compiler's refusal in one line or '')."""
  print(f'[preflight]   compiling {label}', flush=True)
  start = time.time()
  with cli.stage('preflight', f'compiling {label}', HEARTBEAT_S, HEARTBEAT_S):
    try:
      compiled = fn.lower(*args).compile()
    except Exception as e:  # a refusal (e.g. out of memory) is the program's row, not a crash
      lines = [line.strip() for line in str(e).splitlines() if line.strip()]
      return None, time.time() - start, (lines[0] if lines else type(e).__name__)[:300]
  return compiled.fn, time.time() - start, ''


def programs(ctx):
  """[(name, jitted step, abstract args, images per step)] of each phase (at its start) and eval."""
  import jax

  from trainer import run, train

  config, state, out = ctx.config, train.abstract_state(ctx), []
  train_batch = run.abstract_batch(ctx, ctx.dataset.train, config.batch_size)
  for phase in ctx.phases:
    state, step_fn = train.enter_phase(ctx, state, phase, phase.start)
    out.append((phase.name, step_fn, (state, train_batch), config.batch_size))
  zeros = jax.eval_shape(
    lambda: jax.tree.map(lambda v: jax.numpy.asarray(v, 'float32'), run.ZERO_SUMS)
  )
  size = run.eval_batch(ctx)  # the batch a run evaluates in (trainer/train.py)
  eval_args = (state, run.abstract_batch(ctx, ctx.dataset.test, size, mask=True))
  return out + [('eval', train.eval_fn(ctx, state), (*eval_args, run.replicate(ctx, zeros)), size)]


def memory(compiled):
  """{memory_per_chip_gib: arguments + outputs - aliased + temporaries + code, and each part}."""
  m = compiled.memory_analysis()
  kinds = ('argument', 'output', 'alias', 'temp')
  parts = {f'{k}_gib': getattr(m, f'{k}_size_in_bytes') for k in kinds}
  parts['code_gib'] = m.generated_code_size_in_bytes
  total = sum(parts.values()) - 2 * parts['alias_gib']  # aliased outputs are their arguments
  return {'memory_per_chip_gib': total / GIB, **{k: v / GIB for k, v in parts.items()}}


def program_row(compiled, config, chip, facts, images):
  """(the measured columns of one compiled program, its roofline step seconds)."""
  cost = compiled.cost_analysis()
  flops, accessed = float(cost.get('flops', 0.0)), float(cost.get('bytes accessed', 0.0))
  text = compiled.as_text()
  found = products(text)
  mxu_passes = mean_passes(found)
  step_s = tpu.roofline_s(flops, accessed, mxu_passes, chip)
  row = memory(compiled)
  row.update(
    fits=row['memory_per_chip_gib'] <= chip.hbm_gib,
    gflop_per_step=flops * facts['devices'] / 1e9,
    gbyte_per_chip=accessed / 1e9,
    mxu_passes=mxu_passes,
    roofline_ms=step_s * 1e3,
    images_per_s=images / step_s,
    products=len(found),
    products_as_configured=as_configured(found, config),
    configured='; '.join(f'{k} @ {configured(config, k)}' for k in ('conv', 'dense')),
    rounding_ops=rounding_ops(text),
    product_breakdown=breakdown(found),
  )
  return row, step_s


def build_context(config, topology, devs):
  """The run context of `config` on the topology's devices, from the declared dataset."""
  from trainer import run

  chip = tpu.CHIPS[topology.version]
  return run.build(config, input_pipeline.declared(config), devs, device_bytes=chip.hbm_gib * GIB)


def refused_memory(reason, config, devices):
  """The memory columns of a program refused for memory: the GiB per chip it needs (the compiler's
  figure or configs/capacity's lower bound of the activations); {} for another refusal."""
  found, needed = EXHAUSTED.search(reason), None
  if found:
    needed = float(found.group(1)) * UNITS_GIB[found.group(2)]
  elif 'of activations' in reason:
    needed = validation.activation_bytes(config, config.batch_size // devices) / GIB
  return {} if needed is None else {'memory_per_chip_gib': needed, 'fits': False}


def topology_rows(config, topology, devs, runs, wanted, startup_s):
  """(rows, run context) of the `wanted` programs on `topology`; unbuildable: ([why], None)."""
  chip, facts = tpu.CHIPS[topology.version], tpu.facts(devs)
  head = {
    'topology': topology.name,
    'accelerator': facts['device_kind'],
    **{k: facts[k] for k in ('chips', 'hosts', 'devices')},
    'hbm_per_chip_gib': chip.hbm_gib,
    'sweep_runs': runs[0],
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
    row.update(refused_memory(reason, config, facts['devices']))
    print(f'[preflight]   cannot build the run there: {reason}', flush=True)
    return [row], None
  rows, step_s, compile_s = [], {}, {}
  for name, fn, args, images in programs(ctx):
    if name not in wanted:
      continue
    label = f'{topology.name} {name} (batch {images})'
    compiled, seconds, reason = compile_program(fn, args, label)
    row = {**head, 'phase': name, 'batch': images, 'compiled': compiled is not None}
    row.update(reason=reason, compile_s=round(seconds, 1))
    compile_s[name] = seconds
    if compiled is not None:
      measured, step_s[name] = program_row(compiled, config, chip, facts, images)
      row.update(measured)
      said = f'compiled in {row["compile_s"]} s'
    else:
      row.update(refused_memory(reason, config, facts['devices']))
      said = f'NOT compiled after {row["compile_s"]} s: {reason}'
    rows.append(row)
    gib, fits = row.get('memory_per_chip_gib'), 'fits' if row.get('fits') else 'does not fit'
    needs = '' if gib is None else f': {gib:.3g} of {chip.hbm_gib} GiB per chip, {fits}'
    print(f'[preflight]   {name}: {said}{needs}', flush=True)  # its numbers: the table at the end
  terms = tpu.run_terms(ctx, step_s, compile_s, startup_s, facts['hosts']) or {}
  hours = {f'{k}_s': v for k, v in terms.items()}
  if terms:
    run_s, cached = sum(terms.values()), (runs[0] - runs[1]) * terms['compilation']
    hours.update(run_hours=run_s / 3600, sweep_hours=(runs[0] * run_s - cached) / 3600)
  for row in rows:
    row.update(hours)
  return rows, ctx


def max_batch(spec, overrides, topology, devs, config, max_compiles):
  """(largest global batch whose unfrozen step fits a chip, compiles spent), on multiples of devices
  x BatchNorm group; a batch the run's checks refuse does not fit, uncompiled."""
  chip = tpu.CHIPS[topology.version]
  unit = len(devs) * max(1, config.numerics.batchnorm_group)
  limit = len(input_pipeline.declared(config).train) // unit * unit

  def fits(batch):
    try:
      overridden = list(overrides) + [('batch_size', str(batch))]
      ctx = build_context(validation.resolve(common.load(spec, overridden)), topology, devs)
    except ValueError:
      return False
    unfrozen = next(ph.name for ph in ctx.phases if not ph.frozen)
    name, fn, args, _ = next(p for p in programs(ctx) if p[0] == unfrozen)
    label = f'{topology.name} {name} at batch {batch} (--max-batch)'
    compiled, seconds, reason = compile_program(fn, args, label)
    gib = memory(compiled)['memory_per_chip_gib'] if compiled is not None else None
    ok = gib is not None and gib <= chip.hbm_gib
    said = f'not compiled: {reason}'
    if gib is not None:
      said = f'{gib:.3g} GiB per chip, {"fits" if ok else "does not fit"}'
    print(f'[preflight]   batch {batch}: {said} ({seconds:.0f} s)', flush=True)
    return ok

  return tpu.largest_batch(fits, config.batch_size, unit, limit, max_compiles)


def markdown(rows):
  """The rows as a Markdown table, then one line per topology: run and sweep hours, max batch."""
  lines = [
    '| topology | chips (hosts) | program | compiled | GiB per chip (HBM) | fits | '
    'GFLOP/step | roofline ms | images/s | products (as configured) | rounding ops |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    where = f'| {r["topology"]} | {r["chips"]} ({r["hosts"]}) | {r["phase"]} |'
    if not r['compiled']:
      needs = r.get('memory_per_chip_gib')
      memory_cells = f'{needs:.3g} ({r["hbm_per_chip_gib"]}) | NO' if needs is not None else ' |'
      lines.append(f'{where} no: {r["reason"]} | {memory_cells} | | | | | |')
      continue
    lines.append(
      f'{where} yes | {r["memory_per_chip_gib"]:.3g} ({r["hbm_per_chip_gib"]}) | '
      f'{"yes" if r["fits"] else "NO"} | {r["gflop_per_step"]:.4g} | {r["roofline_ms"]:.3g} | '
      f'{r["images_per_s"]:,.0f} | {r["products"]} ({r["products_as_configured"]}) | '
      f'{r["rounding_ops"]} |'
    )
  lines.append('')
  for name in dict.fromkeys(r['topology'] for r in rows):
    first = next(r for r in rows if r['topology'] == name)
    hours = 'no run estimate (it needs every program compiled)'
    if first.get('run_hours') is not None:
      terms = ', '.join(f'{k} {tpu.readable(first[k + "_s"])}' for k in tpu.TERMS)
      run, sweep = (tpu.readable(first[k] * 3600) for k in ('run_hours', 'sweep_hours'))
      hours = f'a run {run} = {terms}; the sweep ({first["sweep_runs"]} runs in turn) {sweep}'
    largest = f'; largest batch that fits: {first["max_batch"]}' if first.get('max_batch') else ''
    lines.append(f'- {name}: {hours}{largest}')
    done = [r for r in rows if r['topology'] == name and r['compiled']]
    for a, b in zip(done, done[1:], strict=False):  # a step needing more than a later phase's
      if b['phase'] != 'eval' and a['memory_per_chip_gib'] > b['memory_per_chip_gib']:
        said = [
          f'{p} {a[f"{p}_gib"]:.3g} vs {b[f"{p}_gib"]:.3g}' for p in ('argument', 'temp', 'code')
        ]
        lines.append(
          f'  - {a["phase"]} needs more than {b["phase"]} per chip: GiB of {", ".join(said)} '
          "(XLA's buffer assignment: memory_analysis())"
        )
  if any(r.get('run_hours') is not None for r in rows):
    lines += ['', 'Where each term comes from:'] + [f'- {k}: {v}' for k, v in tpu.TERMS.items()]
  return '\n'.join(lines)


def write_csv(rows, folder):
  path = os.path.join(folder, 'preflight.csv')
  with open(path, 'w', encoding='utf-8', newline='') as f:
    writer = csv.DictWriter(f, COLUMNS, extrasaction='ignore', lineterminator='\n')
    writer.writeheader()
    writer.writerows(rows)
  return [path]


def main(argv=None):
  """Returns the exit code (module doc)."""
  start = time.time()
  spec, overrides, rest = common.split_argv(sys.argv[1:] if argv is None else argv)
  args = parse_args(rest)
  import jax

  from numerics import setup as numerics_setup

  with contextlib.ExitStack() as stack:
    try:  # bad input: one line, before anything is compiled or written
      if not spec:
        raise ValueError('--config is required, e.g. --config=configs/digits.py:smoke')
      config = validation.resolve(common.load(spec, overrides))
      topologies = {}  # a topology named twice (or by two names) is compiled once
      for t in map(tpu.parse_topology, args.topology):
        topologies.setdefault((t.libtpu_name, repr(t.options)), t)
      topologies = list(topologies.values())
      if args.max_compiles < 1:
        raise ValueError(f'--max-compiles={args.max_compiles}: give a positive number')
      path, arg = common.split_spec(spec)
      module = common.load_module(path)  # the runs of its get_sweep(arg), 1 without one
      sweep = module.get_sweep(arg or None) if hasattr(module, 'get_sweep') else [{}]
      arms = {repr(sorted((k, v) for k, v in o.items() if k != 'seed')) for o in sweep}
      runs = (len(sweep), len(arms))  # later seeds of an arm load its compiles from the cache
      if args.out:
        dest = stack.enter_context(
          files.Destination(args.out, command='preflight', may_write=['preflight.csv'])
        )
      jax.config.update('jax_platforms', 'cpu')  # compile-only TPU devices; nothing runs on one
      jax.config.update('jax_enable_compilation_cache', False)  # every program compiled, timed
      numerics_setup.configure(config)
      devices = [tpu.devices(t) for t in topologies]
    except ValueError as e:
      cli.fail(str(e).splitlines()[0])
    rows, startup_s = [], time.time() - start
    for topology, devs in zip(topologies, devices, strict=True):
      found, ctx = topology_rows(config, topology, devs, runs, args.programs, startup_s)
      if args.max_batch and ctx is not None:
        largest, spent = max_batch(spec, overrides, topology, devs, config, args.max_compiles)
        print(f'[preflight]   largest batch that fits: {largest} ({spent} compiles)', flush=True)
        for row in found:
          row['max_batch'] = largest
      rows += found
    if args.out:
      try:
        print(f'[preflight] wrote {dest.write(lambda folder: write_csv(rows, folder))[0]}')
      except files.WriteFailed as e:
        cli.fail(e, code=1)
  print(markdown(rows))
  print(
    f'[preflight] took {tpu.readable(time.time() - start)} on this host ({os.cpu_count()} CPUs): '
    'compiled programs, not executions'
  )
  return 0 if all(r['compiled'] for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
