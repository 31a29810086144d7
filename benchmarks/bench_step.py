"""One ResNet-18 training step of this project (the run context, trainer/run.py), on synthetic data.

  python -m benchmarks.bench_step                                            # CPU: 64^2, batch 64
  python -m benchmarks.bench_step --config configs/celeba.py:gpu --batch 256 \
      --compute-dtype bfloat16
  python -m benchmarks.bench_step --config configs/celeba.py:gpu --batch 256 --format bf16 \
      --emulate-impl fast                                                   # an emulated arm

The config is loaded as train.py loads it (configs/loader.py, benchmarks/step_args.py):
`--config FILE[:ARGS]` (default step_args.DEFAULT_CONFIG: the CelebA study's model and numerics at
64^2, batch 64), then the shorthand flags
below (each sets one field: --batch is batch_size, --image-size data.image_size, --profile
numerics.profile, ...; --format F sets both numerics.conv_format and numerics.dense_format), then
`--config.FIELD=VALUE` overrides. A bad value stops with one line
`error: ...` (exit code 2) before any compute. The step is the trainer's own, built by the run
context (`run.build` on a synthetic dataset of one global batch of random uint8 images,
`run.init_model`, `run.initial_state`, `run.enter_phase` into the phase where every parameter
trains): uint8 -> normalised f32 on device, forward, cross-entropy, backward, AdamW, state donated,
metrics summed on device. The batch stays on the device: this measures the device step alone.

Reports: compile time (lower + compile), ms/step (median over `--windows` timed windows of
`--steps` steps each, after `--warmup` steps; the host blocks only at the end of a window),
images/s, achieved TFLOP/s from XLA's cost analysis of the compiled step and from the analytic
count (training = 3 x forward = 6 x multiply-adds per image), MFU against the device's peak for
the product format the step really runs in (None where no peak is known, e.g. CPUs), and the
device's peak memory where it reports one. Prints a Markdown table; the last line is
`images_per_sec=<float>`. Imports no TensorFlow (ml_collections: yes, for the config).
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import collections
import statistics
import time

from benchmarks import common, step_args


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_step', description=common.description(__doc__)
  )
  step_args.add_args(parser)
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  step_args.parse_flags(make_parser(), None)

import jax
import numpy as np

from configs import validation
from input_pipeline import base
from models import architecture, resnet
from numerics import emulate as emulate_lib
from numerics import ops, profiles
from numerics import setup as numerics_setup
from trainer import platforms, run

# Dense peak TFLOP/s per device by product format ('bf16', 'tf32', 'f32'); matched by substring
# of jax's device_kind, first match wins: the vendors' data sheets (NVIDIA H100 and H200 Tensor
# Core GPU datasheets, SXM parts unless named; NVIDIA A100 datasheet; Google Cloud TPU system
# architecture pages for v4, v5e and v5p), dense (no sparsity) figures.
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
# Formats made of several bf16 passes run at the bf16 peak divided by the number of passes.
PASSES = {'bf16_3x': 3, 'bf16_4x': 4, 'bf16_6x': 6, 'bf16_9x': 9, 'tf32_3x': 3}


def image_dataset(name, images, num_classes, batch_size, rng):
  """uint8 [N, H, W, 3] `images` as a Dataset: every image a training example with a label drawn
  from `rng`, the first one also the test split (the step never evaluates). Fewer images than
  one batch of `batch_size`: one line, exit code 2."""
  if len(images) < batch_size:
    common.fail(f'{len(images)} images: need at least one batch of {batch_size}')
  labels = rng.integers(0, num_classes, len(images), dtype=np.int32)
  return base.Dataset(
    name, base.Split(images, labels), base.Split(images[:1], labels[:1]), num_classes
  )


def synthetic_dataset(config, num_classes=1000):
  """One global batch of random uint8 images at config.data.image_size (3 channels), random
  labels (image_dataset)."""
  rng = np.random.default_rng(0)
  size, n = config.data.image_size, config.batch_size
  images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
  return image_dataset('synthetic', images, num_classes, n, rng)


# One distinct convolution: input size (square), channels, kernel, stride, padding, whether the
# model needs its input gradient (not the stem's), and the names of the layers that run it.
Conv = collections.namedtuple('Conv', 'size cin cout k stride pad input_grad names')


def conv_out(size, k, stride, pad):
  """Output height (= width) of a k x k convolution (or pooling) on a size x size map."""
  return (size + 2 * pad - k) // stride + 1


def resnet18_convs(image_size, width=1.0, stem='imagenet', in_channels=3):
  """The distinct convolutions of ResNet18(width, stem) on image_size^2, in model order."""
  convs = {}  # (size, cin, cout, k, stride, pad, input_grad) -> names, insertion-ordered

  def add(name, size, cin, cout, k, stride, pad, input_grad=True):
    convs.setdefault((size, cin, cout, k, stride, pad, input_grad), []).append(name)
    return conv_out(size, k, stride, pad)

  channels = [max(1, int(round(c * width))) for c in architecture.STAGE_CHANNELS]
  size = image_size
  if stem == 'imagenet':
    size = add('conv1', size, in_channels, channels[0], 7, 2, 3, input_grad=False)
    size = conv_out(size, 3, 2, 1)  # max-pool
  else:
    size = add('conv1', size, in_channels, channels[0], 3, 1, 1, input_grad=False)
  previous = channels[0]
  for index, (c, blocks) in enumerate(zip(channels, architecture.STAGE_BLOCKS, strict=True)):
    for b in range(blocks):
      stride = 2 if (index > 0 and b == 0) else 1
      name = f'layer{index + 1}.{b}'
      new = add(f'{name}.conv1', size, previous, c, 3, stride, 1)
      add(f'{name}.conv2', new, c, c, 3, 1, 1)
      if stride != 1 or previous != c:
        add(f'{name}.downsample.0', size, previous, c, 1, stride, 0)
      size, previous = new, c
  return [Conv(*key, names=tuple(names)) for key, names in convs.items()]


def analytic_macs(image_size, width=1.0, stem='imagenet', in_channels=3, num_classes=1000):
  """Multiply-adds of one forward pass of ResNet18(width, stem) on image_size^2 (convs + fc)."""
  macs = sum(
    len(c.names) * conv_out(c.size, c.k, c.stride, c.pad) ** 2 * c.k * c.k * c.cin * c.cout
    for c in resnet18_convs(image_size, width, stem, in_channels)
  )
  features = max(1, int(round(architecture.STAGE_CHANNELS[-1] * width)))  # what the fc layer sees
  return macs + features * num_classes


def executed_format(platform, numerics, conv_impl):
  """The product format the hardware really runs the convolutions in (for the MFU peak)."""
  requested = profiles.formats(numerics)
  fmt = requested['conv']
  if fmt != 'native':
    impl = emulate_lib.resolve_impl(numerics.emulate_impl, platform, fmt)
    if impl == 'reference':  # every pass at HIGHEST on exact operands
      return numerics_setup.native_formats(platform, 'highest')[0]
    return 'bf16_4x' if emulate_lib.fast_plan(fmt, platform).split else fmt
  return numerics_setup.kind_formats(
    platform,
    numerics.matmul_precision,
    requested,
    numerics.compute_dtype,
    conv_as_dot=conv_impl == 'im2col',
  )['conv']


def peak_tflops(device_kind, fmt):
  """Dense peak TFLOP/s of one device for `fmt`, or None (unknown device, CPU)."""
  for key, peaks in PEAK_TFLOPS:
    if key.lower() in device_kind.lower():
      if fmt in peaks:
        return peaks[fmt]
      if fmt in PASSES and 'bf16' in peaks:
        return peaks['bf16'] / PASSES[fmt]
      if fmt == 'f32' and 'bf16' in peaks:  # TPU: f32 at HIGHEST is 6 bf16 passes
        return peaks['bf16'] / 6
      return None
  return None


def cost_flops(compiled):
  """XLA's flop count of a compiled computation (per call), or None."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # some backends do not implement it
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or 'flops' not in cost:
    return None
  return float(cost['flops'])


def peak_memory_bytes(devices):
  """Largest peak_bytes_in_use over `devices`, or None where memory_stats is not available."""
  peaks = platforms.memory_stat(devices, 'peak_bytes_in_use')
  return max(peaks) if peaks else None


class JaxStep:
  """The trainer's step for `config`, compiled for one resident batch; `run(n)` times n steps.

  `dataset`: the data (default: synthetic_dataset); the resident batch is its first training
  batch. `compile_step=False`: the step is only lowered (`lowered`; `step` and `flops` None), for
  a caller that compiles its own variants of it. Raises validation.ConfigError on a config the
  devices cannot run (before compiling).
  """

  def __init__(self, config, devices=None, dataset=None, num_classes=1000, compile_step=True):
    self.config = config
    self.devices = list(devices if devices is not None else jax.devices())
    self.ctx = run.build(config, dataset or synthetic_dataset(config, num_classes), self.devices)
    model, _ = run.init_model(self.ctx)
    self.num_params = resnet.count_params(model)
    self.conv_impl = ops.resolve_conv_impl(config.numerics.conv_impl)
    phase = next(p for p in self.ctx.phases if not p.frozen)  # every parameter trains
    self.state, step = run.enter_phase(
      self.ctx, run.initial_state(self.ctx, model), phase, phase.start
    )
    (self.batch,) = list(run.batches(self.ctx, phase.start, phase.start + 1))
    start = time.perf_counter()
    self.lowered = step.lower(self.state, self.batch)  # compile(options) gives variants
    self.step = self.lowered.compile() if compile_step else None
    self.compile_s = time.perf_counter() - start
    self.flops = cost_flops(self.step) if compile_step else None

  def run(self, n, step=None):
    """Seconds for n steps (of `step`, a compiled variant of the step, default self.step), the
    host blocking once at the end."""
    step = step or self.step
    start = time.perf_counter()
    state = self.state
    for _ in range(n):
      state = step(state, self.batch)
    jax.block_until_ready(state)
    self.state = state
    return time.perf_counter() - start


def build_step(config, devices=None, dataset=None, num_classes=1000, compile_step=True):
  """JaxStep(...), a config the devices cannot run ending the process with one line (exit 2)."""
  try:
    return JaxStep(config, devices, dataset, num_classes, compile_step)
  except validation.ConfigError as e:
    common.fail(str(e).splitlines()[0])


def selected_devices(args):
  """The first `--devices` devices (0: all of them)."""
  return jax.devices()[: args.devices] if args.devices else jax.devices()


def measure(args, config):
  """(the step, [seconds per step of each of `--windows` windows] after `--warmup` steps)."""
  bench = build_step(config, selected_devices(args), num_classes=args.num_classes)
  times = common.alternate({'step': bench.run}, args.warmup, args.windows, args.steps)
  return bench, times['step']


def summarize(bench, times):
  """Dict of the reported quantities."""
  c = bench.config
  ms = statistics.median(times) * 1e3
  ips = c.batch_size / (ms / 1e3)
  d = bench.devices[0]
  num_classes = bench.ctx.dataset.num_classes
  analytic = 6.0 * analytic_macs(c.data.image_size, c.model.width, c.model.stem, 3, num_classes)
  analytic *= c.batch_size
  fmt = executed_format(d.platform, c.numerics, bench.conv_impl)
  peak = peak_tflops(str(getattr(d, 'device_kind', '')), fmt)
  xla_tflops = bench.flops / (ms / 1e3) / 1e12 if bench.flops else None
  analytic_tflops = analytic / (ms / 1e3) / 1e12
  total_peak = peak * len(bench.devices) if peak else None
  mem = peak_memory_bytes(bench.devices)
  return dict(
    ms=ms,
    ms_min=min(times) * 1e3,
    ms_max=max(times) * 1e3,
    images_per_sec=ips,
    compile_s=bench.compile_s,
    xla_gflop=bench.flops / 1e9 if bench.flops else None,
    analytic_gflop=analytic / 1e9,
    xla_tflops=xla_tflops,
    analytic_tflops=analytic_tflops,
    format=fmt,
    peak=total_peak,
    mfu_xla=xla_tflops / total_peak if (total_peak and xla_tflops) else None,
    mfu_analytic=analytic_tflops / total_peak if total_peak else None,
    peak_mem_gib=mem / 2**30 if mem is not None else None,
  )


def numerics_line(config, conv_impl, platform):
  """compute dtype, precision, emulation (impl resolved) and conv implementation, in one line."""
  n = config.numerics
  kinds = []
  for kind, fmt in profiles.formats(n).items():
    impl = emulate_lib.resolve_impl(n.emulate_impl, platform, fmt)
    kinds.append(
      f'{kind} {fmt}' + (f' (emulate_impl {n.emulate_impl} -> {impl})' if fmt != 'native' else '')
    )
  return (
    f'compute {n.compute_dtype}, matmul_precision {n.matmul_precision}, '
    f'{", ".join(kinds)}, conv_impl {n.conv_impl} -> {conv_impl}'
  )


def table(bench, s, args):
  c = bench.config
  rows = [
    (
      'config',
      f'ResNet-18 width {c.model.width:g}, {c.model.stem} stem, '
      f'{bench.ctx.dataset.num_classes} classes, {bench.num_params:,} params',
    ),
    (
      'input',
      f'{c.data.image_size}x{c.data.image_size}x3 uint8, global batch {c.batch_size} '
      f'on {len(bench.devices)} device(s)',
    ),
    (
      'numerics',
      numerics_line(c, bench.conv_impl, bench.devices[0].platform)
      + f', executed format {s["format"]}',
    ),
    ('compile (lower+compile)', f'{s["compile_s"]:.1f} s'),
    (
      'ms/step (median; min-max)',
      f'{s["ms"]:.2f} ({s["ms_min"]:.2f}-{s["ms_max"]:.2f}), '
      f'{args.windows} windows x {args.steps} steps',
    ),
    ('images/s', f'{s["images_per_sec"]:.1f}'),
    (
      'GFLOP/step: XLA cost analysis / analytic 6xMACs',
      f'{common.fmt(s["xla_gflop"], ".1f")} / {s["analytic_gflop"]:.1f}',
    ),
    (
      'achieved TFLOP/s: XLA / analytic',
      f'{common.fmt(s["xla_tflops"], ".3f")} / {s["analytic_tflops"]:.3f}',
    ),
    ('peak TFLOP/s (all devices, format)', f'{common.fmt(s["peak"], ".1f")} ({s["format"]})'),
    (
      'MFU: XLA / analytic',
      f'{common.fmt(s["mfu_xla"], ".1%")} / {common.fmt(s["mfu_analytic"], ".1%")}',
    ),
    ('peak device memory', f'{common.fmt(s["peak_mem_gib"], ".2f")} GiB'),
  ]
  lines = ['| quantity | value |', '|---|---|']
  lines += [f'| {k} | {v} |' for k, v in rows]
  return '\n'.join(lines)


def main(argv=None):
  args, config = step_args.parse(make_parser(), argv)
  print(common.environment())
  print(common.command_line('bench_step', argv))
  bench, times = measure(args, config)
  s = summarize(bench, times)
  print(table(bench, s, args))
  print(f'images_per_sec={s["images_per_sec"]:.2f}')


if __name__ == '__main__':
  main()
