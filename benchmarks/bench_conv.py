"""Every distinct ResNet-18 convolution, forward + backward, under conv_impl 'xla' and 'im2col'.

  python -m benchmarks.bench_conv                                   # 64^2, width 1, batch 64
  python -m benchmarks.bench_conv --sizes 16:0.25:small:128:1,8:0.125:small:64:1   # digits presets

For each distinct convolution of `models.resnet.ResNet18(width, stem)` on `--image-size`^2 images
(the stem, each stage's 3x3 convs, the stride-2 3x3 convs, the 1x1 downsamples; NHWC x HWIO, f32,
the model's paddings) this compiles `jit(value_and_grad(sum(conv(x, w) * g), argnums=(x, w)))`
once per impl (`g` is a fixed random cotangent, so that XLA cannot simplify an all-ones one), then
times the two alternately: `--repeats` rounds, each timing `n` calls of either impl (n chosen so
that a measurement lasts at least `--min-time` s), the median per call reported. The stem (`conv1`)
is differentiated w.r.t. its kernel only, as in training: the model never needs the gradient of
its input, the images.

Prints, per configuration, a Markdown table: the convolution, how many times the model runs it
(`count`), multiply-adds per example, compile seconds (lower + compile of that convolution's
forward + backward alone: a model compiles them together, so only the difference carries over) and
ms per call of both impls, their ratio (xla / im2col: > 1 means im2col is faster), what
`ops.conv2d(..., impl='auto')` picks for it on this platform and which impl was faster. Totals
weight every row by its count (the model's forward + backward of the convolutions alone). Then
`auto_vs_best[<config>]=<float>`: total time of the per-shape best impls / total time of auto's
picks (1.0: auto picks the faster impl everywhere; 0.5: the model's convolutions would run twice
as fast with the best picks). The last line is `auto_vs_best=<float>`, the smallest over the
configurations.

`--sizes` runs several configurations in one process, each SIZE[:WIDTH[:STEM[:BATCH[:CHANNELS]]]]
(omitted fields from `--width`, `--stem`, `--batch`, `--in-channels`). Imports no TensorFlow.
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import collections
import math
import statistics
import time

from benchmarks import common


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_conv', description=common.description(__doc__)
  )
  parser.add_argument('--image-size', type=int, default=64, help='image height and width')
  parser.add_argument('--width', type=float, default=1.0, help='model.width')
  parser.add_argument(
    '--stem', default='imagenet', choices=('imagenet', 'small'), help='model.stem'
  )
  parser.add_argument('--batch', type=int, default=64, help='images per call')
  parser.add_argument('--in-channels', type=int, default=3, help='image channels (digits: 1)')
  parser.add_argument(
    '--sizes', default='', help='several configurations, SIZE[:WIDTH[:STEM[:BATCH[:CHANNELS]]]],...'
  )
  parser.add_argument('--repeats', type=int, default=5, help='alternating timed rounds (median)')
  parser.add_argument(
    '--min-time',
    type=float,
    default=0.05,
    help='seconds per timed measurement at least (calls are repeated)',
  )
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  make_parser().parse_args()

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_step import resnet18_convs
from benchmarks.common import command_line, environment
from numerics import ops

IMPLS = ('xla', 'im2col')


def macs(conv):
  """Multiply-adds per example, as numerics.ops counts them for 'auto'."""
  return ops.conv_macs(
    (1, conv.size, conv.size, conv.cin), (conv.k, conv.k, conv.cin, conv.cout), conv.stride
  )


def auto_pick(conv, platform):
  """What `ops.conv2d(..., impl='auto')` runs for this convolution on `platform`."""
  return ops.resolve_conv_impl(
    'auto',
    platform,
    macs=macs(conv),
    kernel_hw=(conv.k, conv.k),
    out_hw=ops.conv_out_hw((1, conv.size, conv.size), conv.stride),
  )


def compile_fwd_bwd(impl, conv, batch, seed=0):
  """(compiled value_and_grad w.r.t. w, and x unless the stem's, its operands, compile seconds)."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(batch, conv.size, conv.size, conv.cin)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(conv.k, conv.k, conv.cin, conv.cout)), jnp.float32)
  padding = [(conv.pad, conv.pad)] * 2
  y_shape = jax.eval_shape(lambda x, w: ops.conv2d(x, w, conv.stride, padding, impl=impl), x, w)
  g = jnp.asarray(rng.normal(size=y_shape.shape), jnp.float32)

  def loss(x, w, g):
    return jnp.sum(ops.conv2d(x, w, conv.stride, padding, impl=impl) * g)

  start = time.perf_counter()
  argnums = (0, 1) if conv.input_grad else (1,)
  compiled = jax.jit(jax.value_and_grad(loss, argnums=argnums)).lower(x, w, g).compile()
  return compiled, (x, w, g), time.perf_counter() - start


def time_calls(compiled, operands, n):
  """Seconds per call over n calls, the host blocking once at the end."""
  start = time.perf_counter()
  for _ in range(n):
    result = compiled(*operands)
  jax.block_until_ready(result)
  return (time.perf_counter() - start) / n


def measure(conv, batch, repeats, min_time):
  """{impl: (compile s, median s per call)}; the impls compiled first, then timed alternately."""
  compiled = {impl: compile_fwd_bwd(impl, conv, batch) for impl in IMPLS}
  calls = {}
  for impl, (fn, operands, _) in compiled.items():
    first = time_calls(fn, operands, 1)  # warm-up, and a guess at the cost of one call
    calls[impl] = max(1, math.ceil(min_time / max(first, 1e-6)))
  times = {impl: [] for impl in IMPLS}
  for r in range(repeats):
    for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
      fn, operands, _ = compiled[impl]
      times[impl].append(time_calls(fn, operands, calls[impl]))
  return {impl: (compiled[impl][2], statistics.median(times[impl])) for impl in IMPLS}


def parse_sizes(text, args):
  """'64,16:0.25:small:128:1' -> [(size, width, stem, batch, in_channels)]."""
  configs = []
  for entry in text.split(','):
    fields = entry.strip().split(':')
    defaults = [args.image_size, args.width, args.stem, args.batch, args.in_channels]
    if not 1 <= len(fields) <= len(defaults):
      raise SystemExit(f'--sizes entry {entry!r}: SIZE[:WIDTH[:STEM[:BATCH[:CHANNELS]]]]')
    values = fields + [str(d) for d in defaults[len(fields) :]]
    if values[2] not in ('imagenet', 'small'):
      raise SystemExit(f"--sizes entry {entry!r}: the stem must be 'imagenet' or 'small'")
    configs.append((int(values[0]), float(values[1]), values[2], int(values[3]), int(values[4])))
  return configs


def describe(conv):
  return (
    f'{conv.size}x{conv.size}x{conv.cin}',
    f'{conv.k}x{conv.k}',
    str(conv.stride),
    str(conv.cout),
  )


def run_config(size, width, stem, batch, in_channels, args):
  """Measures one configuration; returns (Markdown table lines, summary dict)."""
  platform = jax.default_backend()
  lines = [
    '| convolution | input HxWxC | kernel | stride | out C | count | MACs/example '
    '| compile s xla | compile s im2col | ms xla | ms im2col | xla/im2col | auto | best |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  total = collections.Counter()
  for conv in resnet18_convs(size, width, stem, in_channels):
    m = macs(conv)
    result = measure(conv, batch, args.repeats, args.min_time)
    auto = auto_pick(conv, platform)
    best = min(IMPLS, key=lambda impl: result[impl][1])
    count = len(conv.names)
    for impl in IMPLS:
      total[f'compile {impl}'] += result[impl][0]
      total[impl] += count * result[impl][1]
    total['compile auto'] += result[auto][0]
    total['auto'] += count * result[auto][1]
    total['best'] += count * result[best][1]
    name = conv.names[0] + (f' (+{count - 1})' if count > 1 else '')
    name += '' if conv.input_grad else ' (dw only)'
    (c_xla, t_xla), (c_im2col, t_im2col) = result['xla'], result['im2col']
    lines.append(
      f'| {name} | ' + ' | '.join(describe(conv)) + f' | {count} | {m:,} '
      f'| {c_xla:.2f} | {c_im2col:.2f} | {t_xla * 1e3:.2f} | {t_im2col * 1e3:.2f} '
      f'| {t_xla / t_im2col:.2f} | {auto} | {best} |'
    )
  lines.append(
    f'| total (x count) | | | | | | | {total["compile xla"]:.2f} '
    f'| {total["compile im2col"]:.2f} | {total["xla"] * 1e3:.2f} '
    f'| {total["im2col"] * 1e3:.2f} | {total["xla"] / total["im2col"]:.2f} '
    f'| {total["auto"] * 1e3:.2f} ms, compile {total["compile auto"]:.2f} s '
    f'| {total["best"] * 1e3:.2f} ms |'
  )
  return lines, dict(total, auto_vs_best=total['best'] / total['auto'])


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  print(environment())
  print(command_line('bench_conv', argv))
  configs = (
    parse_sizes(args.sizes, args)
    if args.sizes
    else [(args.image_size, args.width, args.stem, args.batch, args.in_channels)]
  )
  jax.jit(lambda x: x + 1).lower(1.0).compile()  # the backend's one-off start-up, untimed
  scores = []
  for size, width, stem, batch, in_channels in configs:
    key = f'{size}:{width:g}:{stem}:{batch}:{in_channels}'
    print(
      f'\nResNet-18 convolutions at {size}x{size}x{in_channels}, width {width:g}, {stem} stem, '
      f'batch {batch}, f32 forward + backward (ms per call, median of {args.repeats})\n'
    )
    lines, summary = run_config(size, width, stem, batch, in_channels, args)
    print('\n'.join(lines))
    print(f'\nauto_vs_best[{key}]={summary["auto_vs_best"]:.3f}')
    scores.append(summary['auto_vs_best'])
  print(f'auto_vs_best={min(scores):.3f}')


if __name__ == '__main__':
  main()
