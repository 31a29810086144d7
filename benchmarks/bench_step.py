"""This project's training step (the trainer's own, for the model and config as train.py loads
them) on synthetic data: its speed, and as modes its product formats (emulate), XLA's deterministic
GPU ops (determinism), the trainer's feed (feed), an epoch's evaluation and save (epoch) and where
its device time goes (profile). Reference: docs/performance.md "The benchmark scripts".

  python -m benchmarks.bench_step --config configs/celeba.py:gpu --batch 256 --format bf16
  python -m benchmarks.bench_step --mode determinism --steps 2 --windows 2   # CPU: 64^2
"""

import collections
import functools
import glob
import gzip
import json
import math
import os
import re
import shutil
import statistics
import tempfile
import time
import timeit

import numpy as np

import input_pipeline
from benchmarks import common
from configs import common as config_common
from configs import validation
from numerics import formats as format_names
from runrecord import files
from trainer import process

# JAX and the trainer load where a mode runs: --help and a bad flag are answered without them.

# Dense peak TFLOP/s per device by product format, matched by substring of jax's device_kind
# (first match wins): the NVIDIA H100, H200 and A100 datasheets (SXM unless named), Google Cloud's
# TPU v4, v5e and v5p system architecture pages.
PEAK_TFLOPS = (
  ('H200', {'bf16': 989.0, 'tf32': 495.0, 'f32': 67.0}),
  ('H100 PCIe', {'bf16': 756.0, 'tf32': 378.0, 'f32': 51.0}),
  ('H100', {'bf16': 989.0, 'tf32': 495.0, 'f32': 67.0}),
  ('A100', {'bf16': 312.0, 'tf32': 156.0, 'f32': 19.5}),
  ('TPU v4', {'bf16': 275.0}),
  ('TPU v5 lite', {'bf16': 197.0}),
  ('TPU v5e', {'bf16': 197.0}),
  ('TPU v5p', {'bf16': 459.0}),
  ('TPU v5', {'bf16': 459.0}),
)
# Formats of several bf16 passes run at the bf16 peak over their passes (TPU f32: 6 passes).
PASSES = {'bf16_3x': 3, 'bf16_4x': 4, 'bf16_6x': 6, 'bf16_9x': 9, 'tf32_3x': 3, 'f32': 6}


def image_dataset(name, images, num_classes, rng, test=None):
  """uint8 [N, H, W, 3] `images` (and `test`; default the first image), random labels."""
  test = images[:1] if test is None else test
  labels = [rng.integers(0, num_classes, len(x), dtype=np.int32) for x in (images, test)]
  splits = map(input_pipeline.Split, (images, test), labels)
  return input_pipeline.Dataset(name, *splits, num_classes)


def synthetic_dataset(config, num_classes=1000):
  """One global batch of random uint8 images at config.data.image_size, random labels."""
  rng, size, n = np.random.default_rng(0), config.data.image_size, config.batch_size
  images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
  return image_dataset('synthetic', images, num_classes, rng)


def analytic_macs(config, num_classes=1000, in_channels=3):
  """Multiply-adds of one forward pass of config's model on one image: every convolution and
  matmul of its jaxpr, traced at native f32 and conv_impl xla (not an emulated format's passes)."""
  import jax
  import ml_collections
  from flax import nnx
  from jax.extend import core

  import models

  native = ml_collections.ConfigDict(config.to_dict())
  native.numerics.update(profile='', conv_format='native', dense_format='native', conv_impl='xla')
  native.numerics.update(compute_dtype='float32', param_dtype='float32')
  model = nnx.eval_shape(lambda: models.build(native, num_classes, in_channels, nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  size = config.data.image_size
  image = jax.ShapeDtypeStruct((1, size, size, in_channels), 'float32')
  closed = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, image)

  def macs(jaxpr):
    total = 0
    for eqn in jaxpr.eqns:
      out = math.prod(eqn.outvars[0].aval.shape)
      if eqn.primitive.name == 'conv_general_dilated':  # output x the kernel's inputs per output
        rhs = eqn.invars[1].aval.shape
        total += out * math.prod(rhs) // rhs[eqn.params['dimension_numbers'].rhs_spec[0]]
      elif eqn.primitive.name == 'dot_general':  # output x the contracted length
        (contracted, _), _ = eqn.params['dimension_numbers']
        total += out * math.prod(eqn.invars[0].aval.shape[d] for d in contracted)
      total += sum(macs(inner) for inner in core.jaxprs_in_params(eqn.params))
    return total

  return macs(closed.jaxpr)


def peak_tflops(device_kind, fmt):
  """Dense peak TFLOP/s of one device for `fmt`, or None (unknown device, CPU)."""
  peaks = next((p for key, p in PEAK_TFLOPS if key.lower() in device_kind.lower()), {})
  if fmt in peaks or fmt not in PASSES or 'bf16' not in peaks:
    return peaks.get(fmt)
  return peaks['bf16'] / PASSES[fmt]


class JaxStep:
  """The trainer's step for `config` (every parameter training) on one resident batch of
  `dataset`; `run(n)` times n steps. `compile_step=False`: lowered only, for variants."""

  def __init__(self, config, devices=None, dataset=None, num_classes=1000, compile_step=True):
    import jax

    from models import layers
    from numerics import ops
    from trainer import run, train

    self.config = config
    self.devices = list(devices if devices is not None else jax.devices())
    self.ctx = run.build(config, dataset or synthetic_dataset(config, num_classes), self.devices)
    model, _ = run.init_model(self.ctx)
    self.num_params = layers.count_params(model)
    self.conv_impl = ops.resolve_conv_impl(config.numerics.conv_impl)
    phase = next(p for p in self.ctx.phases if not p.frozen)
    state = train.initial_state(self.ctx, model)
    self.state, step = train.enter_phase(self.ctx, state, phase, phase.start)
    (self.batch,) = list(run.batches(self.ctx, phase.start, phase.start + 1))
    start = time.perf_counter()
    self.lowered = step.lower(self.state, self.batch)
    self.step = self.lowered.compile() if compile_step else None
    self.compile_s = time.perf_counter() - start

  def run(self, n, step=None):
    """Seconds for n steps of `step` (default self.step), the host blocking once at the end."""
    import jax

    step, state, start = step or self.step, self.state, time.perf_counter()
    for _ in range(n):
      state = step(state, self.batch)
    jax.block_until_ready(state)
    self.state = state
    return time.perf_counter() - start


def build_step(args, config, dataset=None, compile_step=True):
  """JaxStep on the first --devices devices (0: all); a config they cannot run: one line, exit 2."""
  import jax

  devices = jax.devices()[: args.devices] if args.devices else jax.devices()
  try:
    return JaxStep(config, devices, dataset, args.num_classes, compile_step)
  except validation.ConfigError as e:
    common.fail(str(e))


def model_line(bench):
  """The model (its torchvision name) and its input: 'ResNet-18 width 1, imagenet stem, ...'."""
  import models

  c, size, d = bench.config, bench.config.data.image_size, bench.devices
  name = getattr(models.get(c.model.name), 'TORCHVISION', c.model.name)
  return (
    f'{name} width {c.model.width:g}, {c.model.stem} stem, {bench.ctx.dataset.num_classes} '
    f'classes, {size}x{size}x3 uint8, global batch {c.batch_size} on {len(d)} {d[0].platform} '
    'device(s)'
  )


def numerics_line(config, conv_impl, platform):
  """Compute dtype, precision, each kind's format (emulation resolved), the conv implementation."""
  from numerics import ops

  n, kinds = config.numerics, []
  for kind, fmt in format_names.kind_formats(n).items():
    impl = ops.resolve_impl(n.emulate_impl, platform, fmt)
    emulated = f' (emulate_impl {n.emulate_impl} -> {impl})' if fmt != format_names.NATIVE else ''
    kinds.append(f'{kind} {fmt}{emulated}')
  return (
    f'compute {n.compute_dtype}, matmul_precision {n.matmul_precision}, {", ".join(kinds)}, '
    f'conv_impl {n.conv_impl} -> {conv_impl}'
  )


def step_mode(args, config):
  """ms/step, images/s, XLA's and the analytic FLOPs, MFU, peak device memory."""
  from numerics import ops
  from numerics import setup as numerics_setup

  bench = build_step(args, config)
  times = common.alternate({0: bench.run}, args)[0]
  c, d, n, s = config, bench.devices[0], len(bench.devices), statistics.median(times)
  analytic = 6 * analytic_macs(c, bench.ctx.dataset.num_classes) * c.batch_size / 1e12  # 3 x fwd
  try:  # XLA's flop count of the compiled step; backends without one raise their own kinds
    cost = bench.step.cost_analysis()
  except Exception:
    cost = None
  cost = (cost or [None])[0] if isinstance(cost, (list, tuple)) else cost
  xla = float(cost['flops']) / 1e12 if cost and 'flops' in cost else None
  # The format the hardware really runs the convolutions in, for the MFU peak.
  requested = format_names.kind_formats(c.numerics)
  fmt = requested['conv']
  if fmt == format_names.NATIVE:
    native = (d.platform, c.numerics.matmul_precision, requested, c.numerics.compute_dtype)
    fmt = numerics_setup.effective_formats(*native, conv_as_dot=bench.conv_impl == 'im2col')['conv']
  elif ops.resolve_impl(c.numerics.emulate_impl, d.platform, fmt) == 'reference':
    fmt = numerics_setup.native_formats(d.platform, 'highest')[0]  # every pass at HIGHEST
  elif ops.fast_plan(fmt, d.platform).split:
    fmt = 'bf16_4x'
  peak = peak_tflops(str(getattr(d, 'device_kind', '')), fmt)
  peak = peak and peak * n
  memory = process.memory_stat(bench.devices, 'peak_bytes_in_use')
  f = common.fmt
  mfu = f'{f(xla and peak and xla / s / peak, ".1%")} / {f(peak and analytic / s / peak, ".1%")}'
  gflop = f'{f(xla and xla * 1e3, ".1f")} / {analytic * 1e3:.1f}'
  windows = f'{args.windows} windows x {args.steps} steps'
  rows = [
    ('config', f'{model_line(bench)}, {bench.num_params:,} params'),
    ('numerics', f'{numerics_line(c, bench.conv_impl, d.platform)}, executed format {fmt}'),
    ('compile (lower+compile)', f'{bench.compile_s:.1f} s'),
    ('ms/step (median; min-max)', f'{common.spread(times)}, {windows}'),
    ('images/s', f'{c.batch_size / s:.1f}'),
    ('GFLOP/step: XLA cost analysis / analytic 6xMACs', gflop),
    ('achieved TFLOP/s: XLA / analytic', f'{f(xla and xla / s, ".3f")} / {analytic / s:.3f}'),
    ('peak TFLOP/s (all devices, format)', f'{f(peak, ".1f")} ({fmt})'),
    ('MFU: XLA / analytic', mfu),
    ('peak device memory', f'{f(max(memory) / 2**30 if memory else None, ".2f")} GiB'),
  ]
  common.report('', ['quantity', 'value'], rows, f'images_per_sec={c.batch_size / s:.2f}')


# --mode emulate: each format of --formats natively, with emulate_impl=reference and fast.
EMULATED = list(format_names.FORMATS)
DEFAULT_FORMATS = ','.join(f for f, entry in format_names.FORMATS.items() if not entry.noisy)
NATIVE = (('numerics.conv_format', 'native'), ('numerics.dense_format', 'native'))


def emulate_variants(formats, platform):
  """{format: {'native' | 'reference' | 'fast': config overrides, or None where there is none}}:
  native is the precision level whose native format it is, else (bf16) bf16 activations."""
  from numerics import setup as numerics_setup

  plan = {}
  for fmt in formats:
    emulated = (('numerics.conv_format', fmt), ('numerics.dense_format', fmt))
    fast = format_names.FORMATS[fmt].fast is not None
    plan[fmt] = {'native': None, 'reference': emulated + (('numerics.emulate_impl', 'reference'),)}
    plan[fmt]['fast'] = emulated + (('numerics.emulate_impl', 'fast'),) if fast else None
    target = numerics_setup.effective_formats(platform, 'default', {'conv': fmt, 'dense': fmt})
    levels = ('default', 'high', 'highest')
    native = [
      lv for lv in levels if numerics_setup.native_formats(platform, lv) == (target['conv'],) * 2
    ]
    if native:
      plan[fmt]['native'] = NATIVE + (('numerics.matmul_precision', native[0]),)
    elif fmt == 'bf16':
      plan[fmt]['native'] = NATIVE + (('numerics.compute_dtype', 'bfloat16'),)
  return plan


def emulate_mode(args, config):
  import jax

  from numerics import ops

  formats = [f for f in args.formats.split(',') if f]
  if not formats or set(formats) - set(EMULATED):
    common.fail(f'--formats={args.formats}: choose from {",".join(EMULATED)}')
  platform, steps = jax.devices()[0].platform, {}
  plan = emulate_variants(formats, platform)
  for overrides in sorted({o for v in plan.values() for o in v.values() if o is not None}):
    print(f'compiling {dict(overrides)} ...', flush=True)
    variant = config_common.apply_overrides(config.copy_and_resolve_references(), overrides)
    steps[overrides] = build_step(args, validation.resolve(variant))
  times = common.alternate({o: s.run for o, s in steps.items()}, args)
  ips = {o: config.batch_size / statistics.median(t) for o, t in times.items()}
  rows, fast_vs_ref, f = [], [], common.fmt
  for fmt, v in plan.items():
    native, ref, fast = (ips.get(v[impl]) for impl in ('native', 'reference', 'fast'))
    setting = ', '.join(f'{k.split(".")[-1]}={x}' for k, x in (v['native'] or ())[len(NATIVE) :])
    fast_vs_ref += [fast / ref] if fast else []
    ratios = [f(a and b and a / b, '.3f') for a, b in ((ref, native), (fast, native), (fast, ref))]
    fast_s = v['fast'] and steps[v['fast']].compile_s
    compile_s = f'{steps[v["reference"]].compile_s:.1f} / {f(fast_s, ".1f")}'
    speeds = [f(x, '.1f') for x in (native, ref, fast)]
    auto = ops.resolve_impl('auto', platform, fmt)
    rows.append([fmt, setting or 'none on this platform', *speeds, *ratios, auto, compile_s])
  header = ['format', 'native setting', 'native img/s', 'reference img/s', 'fast img/s']
  header += ['reference / native', 'fast / native', 'fast / reference', 'auto here']
  title = f'{model_line(steps[plan[formats[0]]["reference"]])}, conv_impl '
  title += f'{config.numerics.conv_impl}; {common.windows(args)}; ratios of images/s'
  least = min(fast_vs_ref) if fast_vs_ref else float('nan')
  common.report(title, [*header, 'compile s (ref / fast)'], rows, f'fast_vs_reference={least:.4f}')


# --mode determinism: one lowering compiled with XLA's deterministic GPU ops on, off and more.
OPTION, EXCLUDE = 'xla_gpu_deterministic_ops', 'xla_gpu_exclude_nondeterministic_ops'
VARIANTS = {'deterministic': {OPTION: True}, 'nondeterministic': {OPTION: False}}
EXTRA_VARIANTS = {
  'exclude_nondeterministic': {OPTION: False, EXCLUDE: True},
  'deterministic_autotuned': {OPTION: True},  # + the nondeterministic's autotuning results
}
ALL_VARIANTS = (*VARIANTS, *EXTRA_VARIANTS)
SCATTER_OR_SORT = re.compile(r'\b(scatter|select-and-scatter|sort)\(')


def scatter_and_sort_ops(compiled):
  """{operation: count} of scatter, select-and-scatter and sort in a compiled step's HLO."""
  return dict(collections.Counter(SCATTER_OR_SORT.findall(compiled.as_text())))


def repeats_identically(bench, compiled, steps):
  """Whether `steps` steps of `compiled` from one state, run twice, end in bit-identical states."""
  import jax

  from trainer import checkpoint

  start, digests = jax.device_get(bench.state), []
  for _ in range(2):
    bench.state = jax.device_put(start, bench.ctx.replicated)
    bench.run(steps, compiled)
    digests.append(checkpoint.state_digest(bench.state))
  return digests[0] == digests[1]


def determinism_measure(args, config, names=tuple(VARIANTS)):
  """(bench, {variant: {'compiled', 'compile_s', 'ops', 'times', 'repeats'}}, [notes])."""
  bench, out, notes = build_step(args, config, compile_step=False), {}, []
  with tempfile.TemporaryDirectory(prefix='bench_step_') as folder:
    autotune = os.path.join(folder, 'autotune_results.textproto')
    open(autotune, 'w').close()  # empty until the nondeterministic compilation writes it
    for name in names:
      options = {**VARIANTS, **EXTRA_VARIANTS}[name]
      if name == 'nondeterministic':
        options = {**options, 'xla_gpu_dump_autotune_results_to': autotune}
      elif name == 'deterministic_autotuned' and not os.path.getsize(autotune):
        notes.append(
          'deterministic_autotuned left out: the nondeterministic compilation wrote no '
          'autotuning results (XLA:CPU has no autotuner)'
        )
        continue
      elif name == 'deterministic_autotuned':
        options = {**options, 'xla_gpu_load_autotune_results_from': autotune}
      start = time.perf_counter()
      compiled = bench.lowered.compile(options)
      out[name] = {'compiled': compiled, 'compile_s': time.perf_counter() - start}
      out[name]['ops'] = scatter_and_sort_ops(compiled)
  runners = {name: functools.partial(bench.run, step=v['compiled']) for name, v in out.items()}
  times = common.alternate(runners, args)
  for name, v in out.items():
    v['times'] = times[name]
    v['repeats'] = repeats_identically(bench, v['compiled'], args.repeat_steps)
  return bench, out, notes


def determinism_table(bench, results, args):
  """(Markdown table, {variant: its images/s over the nondeterministic variant's})."""
  c = bench.config
  ips = {name: c.batch_size / statistics.median(v['times']) for name, v in results.items()}
  rows = []
  for name, v in results.items():
    ops = ', '.join(f'{k} {n}' for k, n in sorted(v['ops'].items())) or 'none'
    row = [name, common.spread(v['times']), f'{ips[name]:.1f}', ops]
    rows.append(row + ['yes' if v['repeats'] else 'no', f'{v["compile_s"]:.1f}'])
  ops_header = 'scatter/sort ops in the compiled step'
  header = [OPTION, 'ms/step (median; min-max)', 'images/s', ops_header]
  header += [f'{args.repeat_steps} steps repeat bit for bit', 'compile s']
  numerics = numerics_line(c, bench.conv_impl, bench.devices[0].platform)
  title = f'{model_line(bench)}, {numerics}; {common.windows(args)}\n'
  base = ips.get('nondeterministic')
  ratios = {n: ips[n] / base for n in ips if base and n != 'nondeterministic'}
  return title + common.table(header, rows), ratios


def determinism_mode(args, config):
  names = [n.strip() for n in args.variants.split(',') if n.strip()]
  if set(names) - set(ALL_VARIANTS) or not names or len(set(names)) < len(names):
    common.fail(f'--variants={args.variants}: give distinct names among {",".join(ALL_VARIANTS)}')
  if 'deterministic_autotuned' in names and 'nondeterministic' not in names:
    common.fail(
      '--variants: deterministic_autotuned loads the autotuning results of the nondeterministic '
      'compilation; list nondeterministic too'
    )
  if args.repeat_steps < 1:
    common.fail(f'--repeat-steps={args.repeat_steps}: give a positive number of steps')
  # deterministic compiles first: compiled after nondeterministic it ran at nondeterministic's speed
  # (most likely reusing its autotuned kernels from XLA's in-process cache), 111 ms/step against
  # 150 ms when compiled first (H200, batch 2048, BENCHMARKS.md). nondeterministic second: the
  # variants after it (deterministic_autotuned) load its autotuning results
  names.sort(key=lambda n: (n != 'deterministic', n != 'nondeterministic'))
  bench, results, notes = determinism_measure(args, config, names)
  text, ratios = determinism_table(bench, results, args)
  print('\n'.join([text, *notes]))
  for name, ratio in sorted(ratios.items(), key=lambda item: item[0] == 'deterministic'):
    print(f'{name}_vs_nondeterministic={ratio:.4f}')  # deterministic's last: the line tools read


# --mode feed: one resident batch, the host's feed (run.batches) and the devices' (on_device).
FEEDS = ('synthetic', 'host', 'device')


def feed_runner(bench, feed):
  """run(n): seconds of n steps fed by `feed`, each followed by the trainer's non-finite watch."""
  import jax

  from trainer import run, train

  if feed == 'synthetic':
    return bench.run
  watch, bad = train.watch(bench.ctx, bench.state)
  source = [run.feed(bench.ctx, on_device=True)] if feed == 'device' else []
  batches = run.batches(bench.ctx, 0, 1 << 40, *source)  # as long as the benchmark runs

  def run_steps(n):
    nonlocal bad
    start, state = time.perf_counter(), bench.state
    for _ in range(n):
      state = bench.step(state, next(batches))
      bad = watch(bad, state)
    jax.block_until_ready((state, bad))
    bench.state = state
    return time.perf_counter() - start

  return run_steps


def feed_mode(args, config):
  from input_pipeline import batching

  size = config.data.image_size
  with tempfile.TemporaryDirectory(prefix='bench_step_') as folder:
    if args.images:  # the uint8 [N, H, W, 3] memmap to feed from: --images, or random images
      images = np.load(args.images, mmap_mode='r')
      if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:3] != (size,) * 2:
        common.fail(
          f'--images {args.images}: need uint8 [N, {size}, {size}, 3] (data.image_size {size}), '
          f'got {images.dtype} {images.shape}'
        )
    else:
      path, rng, n = os.path.join(folder, 'train.npy'), np.random.default_rng(0), args.examples
      shape = (n or 8 * config.batch_size, size, size, 3)
      images = np.lib.format.open_memmap(path, 'w+', np.uint8, shape)
      for begin in range(0, len(images), 1024):  # chunks: bounded host memory at any size
        images[begin : begin + 1024] = rng.integers(0, 256, images[begin : begin + 1024].shape)
      images.flush()
      images = np.load(path, mmap_mode='r')
    if len(images) < config.batch_size:
      common.fail(f'{len(images)} images: need at least one batch of {config.batch_size}')
    dataset = image_dataset('feed', images, args.num_classes, np.random.default_rng(1))
    bench = build_step(args, config, dataset)
    times = common.alternate({feed: feed_runner(bench, feed) for feed in FEEDS}, args)
  gib = batching.nbytes(bench.ctx.dataset.train) / 2**30
  med = {feed: statistics.median(t) for feed, t in times.items()}
  ratios = {feed: med['synthetic'] / med[feed] for feed in FEEDS}
  rows = [
    [f, common.spread(times[f]), f'{config.batch_size / med[f]:.1f}', f'{ratios[f]:.3f}']
    for f in FEEDS
  ]
  best = max(('host', 'device'), key=ratios.get)
  common.report(
    f'{len(images)} images {images.shape[1:]} uint8 ({gib:.2f} GiB, '
    f'{"--images" if args.images else "random, memory-mapped"}), global batch '
    f'{config.batch_size} on {len(bench.devices)} device(s), prefetch {config.data.prefetch}, '
    f'{args.windows} windows x {args.steps} steps per feed, alternating',
    ['feed', 'ms/step median (min-max)', 'images/s', 'vs synthetic'],
    rows,
    f'faster real feed: {best}',
    f'real_vs_synthetic={ratios[best]:.4f}',
  )


# --mode epoch: an evaluation and an epoch-end save as shares of an epoch (CelebA's, by default).
CELEBA_TRAIN, CELEBA_TEST = 162_038, 40_561


def epoch_mode(args, config):
  import jax

  from input_pipeline import batching
  from trainer import checkpoint, train

  if args.test_examples < 1 or args.repeats < 1:
    common.fail('--test-examples and --repeats must be positive')
  if args.train_examples < config.batch_size:
    common.fail(
      f'--train-examples={args.train_examples}: need at least one batch of {config.batch_size}'
    )
  rng, size = np.random.default_rng(0), config.data.image_size
  image = rng.integers(0, 256, (1, size, size, 3), dtype=np.uint8)  # repeated: stride-0 views
  train_images, test_images = (
    np.broadcast_to(image, (n, size, size, 3)) for n in (args.train_examples, args.test_examples)
  )
  dataset = image_dataset('repeated', train_images, args.num_classes, rng, test_images)
  bench = build_step(args, config, dataset)
  ctx = bench.ctx
  times = {'step': common.alternate({0: bench.run}, args)[0]}
  evaluate = functools.partial(train.evaluate, ctx, train.eval_fn(ctx, bench.state), bench.state)
  evaluate()  # compiles
  times['eval'] = timeit.repeat(evaluate, repeat=args.repeats, number=1)
  with tempfile.TemporaryDirectory(prefix='bench_step_') as workdir:
    mngr, during = checkpoint.manager(workdir, keep=2), min(args.steps, ctx.per_epoch)

    def save():
      step = int(jax.device_get(bench.state['step']))
      checkpoint.save(mngr, step, {'status': 'running', 'step': step}, bench.state)

    times.update(sync=[], total=[], step_while_writing=[])  # seconds of epoch-end saves
    try:
      save()
      for _ in range(args.repeats):
        bench.run(1)  # a new step to save
        checkpoint.wait(mngr)
        start = time.perf_counter()
        save()
        times['sync'].append(time.perf_counter() - start)
        checkpoint.wait(mngr)
        times['total'].append(time.perf_counter() - start)
        bench.run(1)
        save()
        times['step_while_writing'].append(bench.run(during) / during)
      checkpoint.wait(mngr)
    finally:
      checkpoint.close(mngr)
  med = {name: statistics.median(t) for name, t in times.items()}
  epoch_s, test = ctx.per_epoch * med['step'], len(ctx.dataset.test)
  mib = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(bench.state)) / 2**20
  batches = batching.num_eval_batches(test, config.eval_batch_size)
  overhead = (med['eval'] + med['sync']) / epoch_s

  def row(item, name, per_epoch='', unit='s', share=None):
    took = common.spread(times[name], *((1e3, 2) if unit == 'ms' else (1, 3)))
    return [item, f'{took} {unit}', per_epoch, share or f'{med[name] / epoch_s:.1%}']

  while_writing = f'{med["step_while_writing"] / med["step"]:.2f}x the step'
  evaluation = f'{test:,} examples, {batches} batch(es) of {config.eval_batch_size}'
  rows = [
    row('training step', 'step', f'x {ctx.per_epoch} = {epoch_s:.2f} s', 'ms', '100%'),
    row(f'evaluation ({evaluation})', 'eval', 'x 1'),
    row(f'checkpoint save, synchronous part ({mib:.0f} MiB state)', 'sync', 'x 1'),
    row('checkpoint save, total (until written; the rest runs in the background)', 'total'),
    row('training step while the write runs', 'step_while_writing', '', 'ms', while_writing),
    ['overhead per epoch (evaluation + synchronous save)', f'{med["eval"] + med["sync"]:.3f} s']
    + ['', f'{overhead:.1%}'],
  ]
  common.report(
    f'{model_line(bench)}, compute {config.numerics.compute_dtype}; epoch = '
    f'{ctx.per_epoch} steps ({len(ctx.dataset.train):,} examples); medians (min-max) of '
    f'{args.windows} step windows x {args.steps} steps and {args.repeats} evaluations and saves',
    ['item', 'time', 'per epoch', "share of the epoch's training time"],
    rows,
    f'epoch_overhead_fraction={overhead:.4f}',
  )


# --mode profile: a Perfetto trace of --steps steps, read back. A kernel's category by its name
# (first match) where the compiled HLO does not name it (cuDNN, cuBLAS).
CATEGORIES = (
  ('convolution', ('conv', 'implicit', 'dgrad', 'wgrad', 'fprop', 'cudnn')),
  ('matmul', ('gemm', 'cutlass', 'dot', 'matmul')),
  ('reduction fusion', ('reduce', 'reduction')),
  ('copy/transpose', ('copy', 'transpose', 'memcpy', 'memset', 'pad', 'concatenate', 'slice')),
  ('elementwise fusion', ('fusion', 'loop_', 'add', 'multiply', 'convert', 'select')),
)
# `%name = <type> opcode(...)` lines of HLO text; a computation opens with `%name (...) -> ... {`.
INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?\b([a-z][a-z0-9\-]*)\(')
COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+) .*\{\s*$')
MOVES = set(
  'copy transpose concatenate pad slice dynamic-slice bitcast dynamic-update-slice reshape '
  'broadcast parameter constant tuple get-tuple-element reverse iota copy-start copy-done'.split()
)
REDUCTIONS = {'reduce', 'reduce-window', 'select-and-scatter', 'scatter', 'sort'}


def hlo_categories(text):
  """{HLO instruction name: category} from a compiled module's text: a fusion by what its fused
  computation holds, whatever the backend names it (XLA:CPU's 'ynn_fusion' may be a dot)."""
  bodies, lines, current = {}, {}, None
  for line in text.splitlines():
    head = COMPUTATION.match(line)
    if head and not line.startswith(' '):
      current = head.group(1)
      bodies[current] = []
    elif (match := INSTRUCTION.match(line)) and current is not None:
      bodies[current].append((match.group(1), match.group(2)))
      lines[match.group(1)] = line
  out = {}
  for name, opcode in (i for instructions in bodies.values() for i in instructions):
    ops, text_of = {opcode}, lines[name]
    callee = re.search(r'calls=%?([\w.\-]+)', lines[name])
    if callee and callee.group(1) in bodies:
      ops = {op for _, op in bodies[callee.group(1)]}
      text_of = ' '.join(lines[n] for n, _ in bodies[callee.group(1)])
    targets = ' '.join(re.findall(r'custom_call_target="([^"]+)"', text_of)).lower()
    if 'convolution' in ops or 'conv' in targets:
      out[name] = 'convolution'
    elif 'dot' in ops or 'gemm' in targets or 'matmul' in targets:
      out[name] = 'matmul'
    elif ops & REDUCTIONS:
      out[name] = 'reduction fusion'
    else:
      out[name] = 'copy/transpose' if ops <= MOVES else 'elementwise fusion'
  return out


def find_trace(trace_dir):
  """The newest perfetto_trace.json.gz under `trace_dir`."""
  pattern = os.path.join(trace_dir, '**', 'perfetto_trace.json.gz')
  paths = sorted(glob.glob(pattern, recursive=True), key=os.path.getmtime)
  if not paths:
    raise FileNotFoundError(f'no perfetto_trace.json.gz under {trace_dir}')
  return paths[-1]


def device_events(events):
  """(complete events on device tracks: GPU/TPU processes, else XLA:CPU's operations; whence)."""
  names = {
    e['pid']: e.get('args', {}).get('name', '') for e in events if e.get('name') == 'process_name'
  }
  devices = {pid for pid, name in names.items() if '/device:' in name and 'cpu' not in name.lower()}
  complete = [e for e in events if e.get('ph') == 'X' and 'dur' in e]
  if devices:
    return [e for e in complete if e['pid'] in devices], 'device'
  ops = [e for e in complete if 'hlo_op' in e.get('args', {})]
  return ops, 'host XLA operations (CPU: thread-pool work overlaps, so busy time is a union)'


def event_category(event, categories):
  """The event's category: from the HLO instruction it ran (args 'hlo_op'), else its name."""
  op, name = event.get('args', {}).get('hlo_op', event['name']), event['name']
  by_name = next((c for c, keys in CATEGORIES if any(k in name.lower() for k in keys)), 'other')
  return categories.get(op) or categories.get(name) or by_name


def trace_summary(events, steps, categories=None):
  """Per step (microseconds): busy (kernels' union) and span, kernel time by category and kernel."""
  if not events:
    raise ValueError('the trace holds no device events (is a profiler plugin available?)')
  by_category, by_kernel, counts, kinds = collections.Counter(), collections.Counter(), {}, {}
  for e in events:
    kinds[e['name']] = event_category(e, categories or {})
    by_category[kinds[e['name']]] += e['dur'] / steps
    by_kernel[e['name']] += e['dur'] / steps
    counts[e['name']] = counts.get(e['name'], 0) + 1 / steps
  start, stop = np.array(sorted((e['ts'], e['ts'] + e['dur']) for e in events), float).T
  covered = np.maximum.accumulate(np.concatenate([[-np.inf], stop[:-1]]))  # by earlier kernels
  return dict(
    busy=float(np.maximum(stop - np.maximum(start, covered), 0).sum()) / steps,
    span=(stop.max() - start.min()) / steps,
    kernel_sum=sum(e['dur'] for e in events) / steps,
    launches=len(events) / steps,
    by_category=by_category,
    by_kernel=by_kernel,
    kinds=kinds,
    counts=counts,
  )


def profile_mode(args, config):
  import jax

  bench = build_step(args, config)
  bench.run(args.warmup)
  with tempfile.TemporaryDirectory(prefix='bench_step_') as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      seconds = bench.run(args.steps)
    with gzip.open(find_trace(trace_dir), 'rt') as f:
      data = json.load(f)
    if args.trace_dir:  # through runrecord/files.py, beside earlier runs' traces
      paths = glob.glob(os.path.join(trace_dir, '**'), recursive=True)
      names = [os.path.relpath(p, trace_dir) for p in paths if os.path.isfile(p)]

      def write(staging):
        shutil.copytree(trace_dir, staging, dirs_exist_ok=True)
        return [os.path.join(staging, name) for name in names]

      command = f'bench_step profile {os.path.dirname(names[0])}'  # its own writer: none replaced
      kwargs = dict(command=command, flag='--trace-dir', may_write=names)
      with files.Destination(args.trace_dir, **kwargs) as dest:
        dest.write(write)
  where = f'; trace in {args.trace_dir}' if args.trace_dir else ''
  events, source = device_events(data['traceEvents'] if isinstance(data, dict) else data)
  s = trace_summary(events, args.steps, hlo_categories(bench.step.as_text()))
  total = s['kernel_sum']
  print(
    f'traced {args.steps} steps: {seconds / args.steps * 1e3:.2f} ms/step wall under the '
    f'profiler{where}\nevents from: {source}\nper step: device busy {s["busy"] / 1e3:.3f} ms of '
    f'{s["span"] / 1e3:.3f} ms span ({s["busy"] / s["span"]:.1%} busy), {s["launches"]:.0f} '
    f'kernels, sum of kernel times {total / 1e3:.3f} ms\n'
  )
  rows = [[n, f'{us / 1e3:.3f}', f'{us / total:.1%}'] for n, us in s['by_category'].most_common()]
  print(common.table(['category', 'ms/step', 'share of kernel time'], rows) + '\n')
  rows = [
    [f'`{n if len(n) <= 90 else n[:87] + "..."}`', s['kinds'][n], f'{s["counts"][n]:.0f}']
    + [f'{us / 1e3:.3f}', f'{us / total:.1%}']
    for n, us in s['by_kernel'].most_common(args.top)
  ]
  header = [f'top {args.top} kernels', 'category', 'calls/step', 'ms/step', 'share']
  common.report('', header, rows, f'device_busy_fraction={s["busy"] / s["span"]:.4f}')


MODES = dict(step=step_mode, emulate=emulate_mode, determinism=determinism_mode, feed=feed_mode)
MODES.update(epoch=epoch_mode, profile=profile_mode)
MODE_FLAGS = (  # (mode, flag, type, default, help)
  ('emulate', '--formats', str, DEFAULT_FORMATS, f'of {",".join(EMULATED)}'),
  ('determinism', '--variants', str, ','.join(VARIANTS), f'of {",".join(ALL_VARIANTS)}'),
  ('determinism', '--repeat-steps', int, 3, 'steps run twice from one state'),
  ('feed', '--images', str, '', 'a uint8 [N,H,W,3] .npy to feed from'),
  ('feed', '--examples', int, 0, 'random images without --images (0: 8 batches)'),
  ('epoch', '--train-examples', int, CELEBA_TRAIN, "an epoch's examples"),
  ('epoch', '--test-examples', int, CELEBA_TEST, "an evaluation's examples"),
  ('epoch', '--repeats', int, 3, 'timed evaluations and saves'),
  ('profile', '--trace-dir', str, '', 'keep the trace here (for Perfetto or TensorBoard)'),
  ('profile', '--top', int, 25, 'kernels listed'),
)


def main(argv=None):
  parser = common.parser('bench_step', __doc__)
  parser.add_argument('--mode', default='step', choices=tuple(MODES), help='what is measured')
  common.add_step_args(parser)
  owners = common.mode_flags(parser, [(f'--mode {mode}', *rest) for mode, *rest in MODE_FLAGS])
  # --mode emulate resolves each variant's config itself
  args, config = common.parse_step_config(parser, argv, resolve=lambda a: a.mode != 'emulate')
  common.refuse_other_modes(parser, args, owners, f'--mode {args.mode}')
  common.command_line('bench_step', argv)
  MODES[args.mode](args, config)


if __name__ == '__main__':
  main()
