"""One ResNet-18 training step of this project (trainer.steps), on synthetic uint8 data.

  python -m benchmarks.bench_step --image-size 64 --batch 64                       # CPU
  python -m benchmarks.bench_step --image-size 224 --batch 256 --compute-dtype bfloat16   # GPU

The step is the project's own: `resnet.create_model` -> `steps.init_state` ->
`steps.make_train_step` (uint8 -> normalised f32 on device, forward, softmax cross-entropy,
backward, AdamW through `optim.masked_update`, state donated, metrics summed on device). One
synthetic batch stays on the device, so this measures the device step alone (no input pipeline).

Reports: compile time (lower + compile), ms/step (median over `--windows` timed windows of
`--steps` steps each, after `--warmup` steps; the host blocks only at the end of a window),
images/s, achieved TFLOP/s from XLA's cost analysis of the compiled step and from the analytic
count (training = 3 x forward = 6 x multiply-adds per image; REFERENCE.md section 5), MFU against
the device's peak for the product format the step really runs in (None where no peak is known,
e.g. CPUs), and the device's peak memory where it reports one. Prints a Markdown table; the last
line is `images_per_sec=<float>`.

Imports neither TensorFlow nor ml_collections: the config is a small dict-backed stand-in that
`create_model`, `numerics.setup` and `trainer.optim` read like a ConfigDict.
"""

import argparse
import collections
import os
import platform as platform_lib
import statistics
import sys
import time

if __package__ in (None, ''):  # run as a file: make the repository importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from models import resnet  # noqa: E402
from numerics import ops  # noqa: E402
from numerics import setup as numerics_setup  # noqa: E402
from trainer import optim, steps, validation  # noqa: E402

# Dense peak TFLOP/s per device by product format ('bf16', 'tf32', 'f32'); matched by substring
# of jax's device_kind, first match wins (REFERENCE.md section 5; vendor data sheets, SXM parts).
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
PASSES = {'bf16_3x': 3, 'bf16_6x': 6, 'bf16_9x': 9, 'tf32_3x': 3}


class Cfg(dict):
  """A dict with attribute access: the subset of ConfigDict the model and numerics code reads."""

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(name) from None

  def __setattr__(self, name, value):
    self[name] = value


def make_config(args):
  """The fields create_model / numerics.setup / trainer.optim read, from the command line."""
  return Cfg(
      seed=0, num_epochs=1,
      model=Cfg(name='resnet18', width=float(args.width), stem=args.stem, reinit=('stem', 'head')),
      numerics=Cfg(matmul_precision=args.matmul_precision, compute_dtype=args.compute_dtype,
                   param_dtype='float32', emulate=args.emulate, batchnorm_group=0,
                   gpu_deterministic=False, conv_impl=args.conv_impl),
      optim=Cfg(learning_rate=0.01, weight_decay=0.001, b1=0.9, b2=0.999, eps=1e-8,
                warmup_epochs=0.0, freeze_epochs=0, schedule='per_phase'))


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

  channels = [max(1, int(round(c * width))) for c in resnet.STAGE_CHANNELS]
  size = image_size
  if stem == 'imagenet':
    size = add('conv1', size, in_channels, channels[0], 7, 2, 3, input_grad=False)
    size = conv_out(size, 3, 2, 1)  # max-pool
  else:
    size = add('conv1', size, in_channels, channels[0], 3, 1, 1, input_grad=False)
  previous = channels[0]
  for index, (c, blocks) in enumerate(zip(channels, resnet.STAGE_BLOCKS)):
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
  macs = sum(len(c.names) * conv_out(c.size, c.k, c.stride, c.pad) ** 2 * c.k * c.k * c.cin
             * c.cout for c in resnet18_convs(image_size, width, stem, in_channels))
  features = max(1, int(round(resnet.STAGE_CHANNELS[-1] * width)))  # what the fc layer sees
  return macs + features * num_classes


def executed_format(platform, matmul_precision, emulate, compute_dtype, conv_impl):
  """The product format the hardware really runs the convolutions in (for the MFU peak)."""
  if emulate != 'none':  # emulation runs every pass at HIGHEST on exact operands
    return numerics_setup.native_formats(platform, 'highest')[0]
  formats = numerics_setup.effective_formats(platform, matmul_precision, emulate, compute_dtype)
  return formats['dense'] if conv_impl == 'im2col' else formats['conv']


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
  except Exception:  # noqa: BLE001 - some backends do not implement it
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost or 'flops' not in cost:
    return None
  return float(cost['flops'])


def peak_memory_bytes(devices):
  """Largest peak_bytes_in_use over `devices`, or None where memory_stats is not available."""
  peaks = validation.memory_stat(devices, 'peak_bytes_in_use')
  return max(peaks) if peaks else None


class JaxStep:
  """The project's train step, compiled for one synthetic batch; `run(n)` times n steps."""

  def __init__(self, args, devices=None):
    self.args = args
    config = make_config(args)
    numerics_setup.configure(config)  # jax_default_matmul_precision, before tracing
    self.config = config
    self.devices = list(devices if devices is not None else jax.devices())
    if args.batch % len(self.devices):
      raise SystemExit(f'--batch {args.batch} must divide over {len(self.devices)} devices')
    mesh = steps.make_mesh(self.devices)
    replicated, sharded = steps.shardings(mesh)

    def create():
      return resnet.create_model(config, args.num_classes, 3, nnx.Rngs(params=0))
    graphdef, _ = nnx.split(nnx.eval_shape(create))
    # Initialisation compiled at XLA's lowest backend optimisation: the random-number code takes
    # ~30 s CPU to compile otherwise (values may differ from the trainer's in the last bit).
    init = jax.jit(lambda: nnx.state(create())).lower().compile(
        compiler_options={'xla_backend_optimization_level': 0})
    model = nnx.merge(graphdef, init())
    self.conv_impl = ops.resolve_conv_impl(model.conv1.conv_impl)
    self.num_params = resnet.count_params(model)
    all_phases = optim.phases(config, 1000)
    tx = optim.make_optimizer(config, 1000, all_phases[0])
    state = steps.init_state(model, tx)
    mask = optim.trainable_mask(state['params'], False, config.model.reinit)
    self.state = jax.device_put(state, replicated)
    rng = np.random.default_rng(0)
    batch = {'image': rng.integers(0, 256, (args.batch, args.image_size, args.image_size, 3),
                                   dtype=np.uint8),
             'label': rng.integers(0, args.num_classes, (args.batch,), dtype=np.int32)}
    self.batch = jax.device_put(batch, sharded)
    step = steps.make_train_step(mesh, graphdef, tx, mask, 'identity', (0.5,) * 3, (0.5,) * 3,
                                 args.flip, 0)
    start = time.perf_counter()
    self.step = step.lower(self.state, self.batch).compile()
    self.compile_s = time.perf_counter() - start
    self.flops = cost_flops(self.step)

  def run(self, n):
    """Seconds for n steps, the host blocking once at the end."""
    start = time.perf_counter()
    state = self.state
    for _ in range(n):
      state = self.step(state, self.batch)
    jax.block_until_ready(state)
    self.state = state
    return time.perf_counter() - start


def add_args(parser):
  parser.add_argument('--image-size', type=int, default=64)
  parser.add_argument('--batch', type=int, default=64, help='global batch')
  parser.add_argument('--width', type=float, default=1.0)
  parser.add_argument('--stem', default='imagenet', choices=('imagenet', 'small'))
  parser.add_argument('--num-classes', type=int, default=1000)
  parser.add_argument('--compute-dtype', default='float32', choices=numerics_setup.DTYPES)
  parser.add_argument('--matmul-precision', default='default', choices=numerics_setup.PRECISIONS)
  parser.add_argument('--emulate', default='none', choices=('none', 'bf16', 'bf16_3x', 'tf32',
                                                            'f32'))
  parser.add_argument('--conv-impl', default='auto', choices=ops.CONV_IMPLS)
  parser.add_argument('--flip', action='store_true', help='random flips in the step')
  parser.add_argument('--steps', type=int, default=10, help='steps per timed window')
  parser.add_argument('--windows', type=int, default=5, help='timed windows (median reported)')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps after compiling')
  parser.add_argument('--devices', type=int, default=0, help='use the first N devices (0: all)')


def environment():
  """Device, versions, date and load average: one line for the record."""
  d = jax.devices()[0]
  try:
    load = '%.2f %.2f %.2f' % os.getloadavg()
  except OSError:
    load = 'n/a'
  import flax
  import optax
  return (f'device: {d.platform} {getattr(d, "device_kind", "")} x{jax.device_count()} | '
          f'jax {jax.__version__}, jaxlib {jax.lib.__version__ if hasattr(jax.lib, "__version__") else ""}, '
          f'flax {flax.__version__}, optax {optax.__version__}, python '
          f'{platform_lib.python_version()} | cpus {os.cpu_count()} | '
          f'{time.strftime("%Y-%m-%d %H:%M:%S %Z")} | load average {load}')


def command_line(module, argv):
  """'command: python -m benchmarks.<module> <arguments>': the second line of every record."""
  return f'command: python -m benchmarks.{module} ' + ' '.join(sys.argv[1:] if argv is None
                                                                else argv)


def selected_devices(args):
  """The first `--devices` devices (0: all of them)."""
  return jax.devices()[:args.devices] if args.devices else jax.devices()


def measure(args):
  bench = JaxStep(args, selected_devices(args))
  bench.run(args.warmup)
  times = [bench.run(args.steps) / args.steps for _ in range(args.windows)]
  return bench, times


def summarize(bench, times):
  """Dict of the reported quantities."""
  args = bench.args
  ms = statistics.median(times) * 1e3
  ips = args.batch / (ms / 1e3)
  d = bench.devices[0]
  analytic = 6.0 * analytic_macs(args.image_size, args.width, args.stem, 3, args.num_classes)
  analytic *= args.batch
  fmt = executed_format(d.platform, args.matmul_precision, args.emulate, args.compute_dtype,
                        bench.conv_impl)
  peak = peak_tflops(str(getattr(d, 'device_kind', '')), fmt)
  xla_tflops = bench.flops / (ms / 1e3) / 1e12 if bench.flops else None
  analytic_tflops = analytic / (ms / 1e3) / 1e12
  total_peak = peak * len(bench.devices) if peak else None
  mem = peak_memory_bytes(bench.devices)
  return dict(
      ms=ms, ms_min=min(times) * 1e3, ms_max=max(times) * 1e3, images_per_sec=ips,
      compile_s=bench.compile_s, xla_gflop=bench.flops / 1e9 if bench.flops else None,
      analytic_gflop=analytic / 1e9, xla_tflops=xla_tflops, analytic_tflops=analytic_tflops,
      format=fmt, peak=total_peak,
      mfu_xla=xla_tflops / total_peak if (total_peak and xla_tflops) else None,
      mfu_analytic=analytic_tflops / total_peak if total_peak else None,
      peak_mem_gib=mem / 2**30 if mem is not None else None)


def _fmt(value, spec):
  return 'n/a' if value is None else format(value, spec)


def table(bench, s):
  args = bench.args
  rows = [
      ('config', f'ResNet-18 width {args.width:g}, {args.stem} stem, {args.num_classes} classes, '
                 f'{bench.num_params:,} params'),
      ('input', f'{args.image_size}x{args.image_size}x3 uint8, global batch {args.batch} on '
                f'{len(bench.devices)} device(s)'),
      ('numerics', f'compute {args.compute_dtype}, matmul_precision {args.matmul_precision}, '
                   f'emulate {args.emulate}, conv_impl {args.conv_impl} -> {bench.conv_impl}, '
                   f'executed format {s["format"]}'),
      ('compile (lower+compile)', f'{s["compile_s"]:.1f} s'),
      ('ms/step (median; min-max)', f'{s["ms"]:.2f} ({s["ms_min"]:.2f}-{s["ms_max"]:.2f}), '
                                    f'{args.windows} windows x {args.steps} steps'),
      ('images/s', f'{s["images_per_sec"]:.1f}'),
      ('GFLOP/step: XLA cost analysis / analytic 6xMACs',
       f'{_fmt(s["xla_gflop"], ".1f")} / {s["analytic_gflop"]:.1f}'),
      ('achieved TFLOP/s: XLA / analytic',
       f'{_fmt(s["xla_tflops"], ".3f")} / {s["analytic_tflops"]:.3f}'),
      ('peak TFLOP/s (all devices, format)', f'{_fmt(s["peak"], ".1f")} ({s["format"]})'),
      ('MFU: XLA / analytic', f'{_fmt(s["mfu_xla"], ".1%")} / {_fmt(s["mfu_analytic"], ".1%")}'),
      ('peak device memory', f'{_fmt(s["peak_mem_gib"], ".2f")} GiB'),
  ]
  lines = ['| quantity | value |', '|---|---|']
  lines += [f'| {k} | {v} |' for k, v in rows]
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_args(parser)
  args = parser.parse_args(argv)
  print(environment())
  print(command_line('bench_step', argv))
  bench, times = measure(args)
  s = summarize(bench, times)
  print(table(bench, s))
  print(f'images_per_sec={s["images_per_sec"]:.2f}')


if __name__ == '__main__':
  main()
