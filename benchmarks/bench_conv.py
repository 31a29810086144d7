"""The step's kernels alone, forward and backward, variants timed alternately: every distinct
ResNet-18 convolution under conv_impl 'xla' and 'im2col', or (--pool) the stem's max pool, flax's
against the scatter-free models/layers.py max_pool. Reference: docs/performance.md.

  python -m benchmarks.bench_conv                                   # 64^2, width 1, batch 64
  python -m benchmarks.bench_conv --sizes 16:0.25:small:128:1,8:0.125:small:64:1   # digits presets
  python -m benchmarks.bench_conv --pool                            # the stem at 224^2, batch 256
"""

import collections
import functools
import math
import statistics
import time

import numpy as np

from benchmarks import common

# JAX, flax and the model load where a mode runs: --help and a bad flag are answered without them.

IMPLS = ('xla', 'im2col')
STEMS = ('imagenet', 'small')
# One distinct convolution: input size (square), channels, kernel, stride, padding, whether the
# model needs its input's gradient (not the stem's: its input is the images), the layers running it.
Conv = collections.namedtuple('Conv', 'size cin cout k stride pad input_grad names')


def conv_out(size, k, stride, pad):
  """Output height (= width) of a k x k convolution (or pooling) on a size x size map."""
  return (size + 2 * pad - k) // stride + 1


def resnet18_convs(image_size, width=1.0, stem='imagenet', in_channels=3):
  """The distinct convolutions of ResNet18(width, stem) on image_size^2, in model order."""
  from models import resnet

  convs = {}  # (size, cin, cout, k, stride, pad, input_grad) -> names, insertion-ordered

  def add(name, size, cin, cout, k, stride, pad, input_grad=True):
    convs.setdefault((size, cin, cout, k, stride, pad, input_grad), []).append(name)
    return conv_out(size, k, stride, pad)

  channels = resnet.stage_channels(width)
  if stem == 'imagenet':
    size = add('conv1', image_size, in_channels, channels[0], 7, 2, 3, input_grad=False)
    size = conv_out(size, 3, 2, 1)  # the max pool
  else:
    size = add('conv1', image_size, in_channels, channels[0], 3, 1, 1, input_grad=False)
  previous = channels[0]
  for index, (c, blocks) in enumerate(zip(channels, resnet.ResNet18.STAGES, strict=True)):
    for b in range(blocks):
      stride, name = (2 if index > 0 and b == 0 else 1), f'layer{index + 1}.{b}'
      new = add(f'{name}.conv1', size, previous, c, 3, stride, 1)
      add(f'{name}.conv2', new, c, c, 3, 1, 1)
      if stride != 1 or previous != c:
        add(f'{name}.downsample.0', size, previous, c, 1, stride, 0)
      size, previous = new, c
  return [Conv(*key, names=tuple(names)) for key, names in convs.items()]


def macs(conv):
  """Multiply-adds per example, as numerics.ops counts them for 'auto'."""
  from numerics import ops

  x, w = (1, conv.size, conv.size, conv.cin), (conv.k, conv.k, conv.cin, conv.cout)
  return ops.conv_macs(x, w, conv.stride)


def auto_pick(conv, platform):
  """What `ops.conv2d(..., impl='auto')` runs for this convolution on `platform`."""
  from numerics import ops

  out_hw = ops.conv_out_hw((1, conv.size, conv.size), conv.stride)
  kernel = (conv.k, conv.k)
  return ops.resolve_conv_impl('auto', platform, macs=macs(conv), kernel_hw=kernel, out_hw=out_hw)


def timed_calls(compiled, operands):
  """run(n): seconds of n calls of compiled(*operands), the host blocking once at the end."""
  import jax

  def run(n):
    start, result = time.perf_counter(), None
    for _ in range(n):
      result = compiled(*operands)
    jax.block_until_ready(result)
    return time.perf_counter() - start

  return run


def compile_conv(impl, conv, batch):
  """(run(n), compile s) of value_and_grad(sum(conv(x, w) * g)) w.r.t. w (and x but for the stem);
  g random (XLA could simplify an all-ones cotangent)."""
  import jax
  import jax.numpy as jnp

  from numerics import ops

  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(batch, conv.size, conv.size, conv.cin)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(conv.k, conv.k, conv.cin, conv.cout)), jnp.float32)
  padding = [(conv.pad, conv.pad)] * 2
  conv2d = functools.partial(ops.conv2d, stride=conv.stride, padding=padding, impl=impl)
  g = jnp.asarray(rng.normal(size=jax.eval_shape(conv2d, x, w).shape), jnp.float32)
  start = time.perf_counter()
  grad = jax.value_and_grad(
    lambda x, w, g: jnp.sum(conv2d(x, w) * g), argnums=(0, 1) if conv.input_grad else (1,)
  )
  compiled = jax.jit(grad).lower(x, w, g).compile()
  return timed_calls(compiled, (x, w, g)), time.perf_counter() - start


def parse_sizes(text, args):
  """'64,16:0.25:small:128:1' -> [(size, width, stem, batch, in_channels)]; bad: exit 2."""
  configs = []
  for entry in text.split(','):
    fields = entry.strip().split(':')
    defaults = [args.image_size, args.width, args.stem, args.batch, args.in_channels]
    values = fields + [str(d) for d in defaults[len(fields) :]]
    try:
      config = (int(values[0]), float(values[1]), values[2], int(values[3]), int(values[4]))
    except (ValueError, IndexError):
      config = None
    if len(fields) > len(defaults) or config is None or config[2] not in STEMS:
      common.fail(
        f'--sizes entry {entry!r}: SIZE[:WIDTH[:STEM[:BATCH[:CHANNELS]]]], STEM one of {STEMS}'
      )
    configs.append(config)
  return configs


def conv_table(size, width, stem, batch, in_channels, args):
  """(Markdown table of one configuration, total of the best impls / total of auto's picks)."""
  import jax

  rows, total = [], collections.Counter()
  for conv in resnet18_convs(size, width, stem, in_channels):
    compiled = {impl: compile_conv(impl, conv, batch) for impl in IMPLS}
    calls = {
      impl: max(1, math.ceil(args.min_time / max(run(1), 1e-6)))
      for impl, (run, _) in compiled.items()
    }
    times = {impl: [] for impl in IMPLS}
    for r in range(args.repeats):
      for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
        times[impl].append(compiled[impl][0](calls[impl]) / calls[impl])
    # (compile s, median s per call) of alternating rounds
    result = {impl: (compiled[impl][1], statistics.median(times[impl])) for impl in IMPLS}
    auto = auto_pick(conv, jax.default_backend())
    best = min(IMPLS, key=lambda impl: result[impl][1])
    count = len(conv.names)
    for impl, (compile_s, seconds) in [*result.items(), ('auto', result[auto])]:
      total[f'compile {impl}'] += compile_s
      total[impl] += count * seconds
    total['best'] += count * result[best][1]
    name = conv.names[0] + (f' (+{count - 1})' if count > 1 else '')
    shape = [f'{conv.size}x{conv.size}x{conv.cin}', f'{conv.k}x{conv.k}', conv.stride, conv.cout]
    (c_xla, t_xla), (c_im2col, t_im2col) = result['xla'], result['im2col']
    timing = [f'{x:.2f}' for x in (c_xla, c_im2col, t_xla * 1e3, t_im2col * 1e3, t_xla / t_im2col)]
    dw = '' if conv.input_grad else ' (dw only)'
    rows.append([name + dw, *shape, count, f'{macs(conv):,}', *timing, auto, best])
  t = {k: v * 1e3 if 'compile' not in k else v for k, v in total.items()}
  auto = f'{t["auto"]:.2f} ms, compile {t["compile auto"]:.2f} s'
  totals = [t['compile xla'], t['compile im2col'], t['xla'], t['im2col'], t['xla'] / t['im2col']]
  totals = [f'{x:.2f}' for x in totals]
  rows.append(['total (x count)', *[''] * 6, *totals, auto, f'{t["best"]:.2f} ms'])
  header = ['convolution', 'input HxWxC', 'kernel', 'stride', 'out C', 'count', 'MACs/example']
  header += ['compile s xla', 'compile s im2col', 'ms xla', 'ms im2col', 'xla/im2col']
  return common.table([*header, 'auto', 'best'], rows), total['best'] / total['auto']


def pool_mode(args):
  """The stem's 3x3/2 pool, flax's and models/layers.py's, with XLA's deterministic GPU ops on and
  off: the gradient of sum(pool(x) * g), post-ReLU x."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from benchmarks import bench_step
  from models import layers

  if min(args.batch, args.size, args.channels, args.steps, args.windows) < 1:
    common.fail('--batch, --size, --channels, --steps and --windows must be positive')
  window, strides, padding = (3, 3), (2, 2), ((1, 1), (1, 1))
  pools = {'flax nnx.max_pool': nnx.max_pool, 'models/layers.py': layers.max_pool}
  rng = np.random.default_rng(0)
  shape = (args.batch, args.size, args.size, args.channels)
  x = jnp.asarray(np.maximum(rng.standard_normal(shape), 0), args.dtype)
  g = jnp.asarray(
    rng.standard_normal(layers.max_pool(x, window, strides, padding).shape), args.dtype
  )
  runners = {}
  for name, fn in pools.items():
    loss = lambda v, g, fn=fn: jnp.sum((fn(v, window, strides, padding) * g).astype(jnp.float32))  # noqa: E731
    lowered = jax.jit(jax.grad(loss)).lower(x, g)
    for mode, options in bench_step.VARIANTS.items():
      runners[(name, mode)] = timed_calls(lowered.compile(options), (x, g))
  times = common.alternate(runners, args)
  med = {key: statistics.median(t) for key, t in times.items()}
  title = f'{args.batch}x{args.size}x{args.size}x{args.channels} {args.dtype}, forward + backward; '
  reference = med[('flax nnx.max_pool', 'nondeterministic')]
  rows = [
    [*key, common.spread(t, 1e3, 3), f'{reference / med[key]:.2f}x'] for key, t in times.items()
  ]
  header = ['pool', 'xla_gpu_deterministic_ops', 'ms/call (median; min-max)']
  speedup = reference / med[('models/layers.py', 'deterministic')]
  title += common.windows(args, 'calls')
  common.report(title, [*header, 'vs flax, nondeterministic'], rows, f'pool_speedup={speedup:.3f}')


CONV, POOL = 'the convolutions (no --pool)', '--pool'
MODE_FLAGS = (  # (mode, flag, type, default, help)
  (CONV, '--image-size', int, 64, 'image height and width'),
  (CONV, '--width', float, 1.0, 'model.width'),
  (CONV, '--stem', str, 'imagenet', "model.stem: 'imagenet' or 'small'"),
  (CONV, '--in-channels', int, 3, 'image channels (digits: 1)'),
  (CONV, '--sizes', str, '', 'configurations, SIZE[:WIDTH[:STEM[:BATCH[:CHANNELS]]]],...'),
  (CONV, '--repeats', int, 5, 'alternating timed rounds (median)'),
  (CONV, '--min-time', float, 0.05, 'seconds per timed measurement at least'),
  (POOL, '--size', int, 112, "the pool's input height and width"),
  (POOL, '--channels', int, 64, "the pool's input channels"),
  (POOL, '--dtype', str, 'bfloat16', "the input's dtype: bfloat16 or float32"),
  (POOL, '--steps', int, 20, 'calls per timed window'),
  (POOL, '--windows', int, 5, 'timed windows (median)'),
  (POOL, '--warmup', int, 3, 'untimed calls first'),
)


def main(argv=None):
  parser = common.parser('bench_conv', __doc__)
  parser.add_argument('--pool', action='store_true', help="the stem's max pool, not convolutions")
  parser.add_argument('--batch', type=int, help='images per call (default 64; --pool: 256)')
  owners = common.mode_flags(parser, MODE_FLAGS)
  args = parser.parse_args(argv)
  common.refuse_other_modes(parser, args, owners, POOL if args.pool else CONV)
  if args.stem not in STEMS or args.dtype not in ('bfloat16', 'float32'):
    common.fail(f'--stem: one of {STEMS}; --dtype: bfloat16 or float32')
  args.batch = args.batch or (256 if args.pool else 64)
  common.command_line('bench_conv', argv)
  if args.pool:
    return pool_mode(args)
  import jax

  configs = parse_sizes(args.sizes or str(args.image_size), args)
  jax.jit(lambda x: x + 1).lower(1.0).compile()  # the backend's one-off start-up, untimed
  scores = []
  for size, width, stem, batch, in_channels in configs:
    print(
      f'\nResNet-18 convolutions at {size}x{size}x{in_channels}, width {width:g}, {stem} stem, '
      f'batch {batch}, f32 forward + backward (ms per call, median of {args.repeats})\n'
    )
    text, score = conv_table(size, width, stem, batch, in_channels, args)
    print(text)
    print(f'\nauto_vs_best[{size}:{width:g}:{stem}:{batch}:{in_channels}]={score:.3f}')
    scores.append(score)
  print(f'auto_vs_best={min(scores):.3f}')


if __name__ == '__main__':
  main()
