"""The stem's max pool, forward + backward: flax's (select_and_scatter) against models/pool.py.

  python -m benchmarks.bench_pool                                # GPU: the stem at 224^2, batch 256
  python -m benchmarks.bench_pool --batch 16 --size 56 --dtype float32    # CPU

The ResNet stem's 3x3/2 pool (padding 1) on an NHWC input of `--batch` x `--size`^2 x
`--channels` (at 224^2 the pool sees 112^2 x 64): the gradient of sum(pool(x) * g) for a fixed
random cotangent g, i.e. the forward pass and the backward pass the training step runs. Each
implementation is compiled with XLA's deterministic GPU operations on and off (per compilation,
`compiler_options`: bench_determinism.VARIANTS), all four timed in alternating windows in
one process. Prints ms per call (median; min-max); the last line is `pool_speedup=<float>`:
flax's nondeterministic time over models/pool.py's deterministic one (> 1: the deterministic,
scatter-free pool is faster than the pool the study ran before). On CPU the option changes
nothing (XLA:CPU is deterministic either way).
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import statistics
import time

from benchmarks import common


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_pool', description=common.description(__doc__)
  )
  parser.add_argument('--batch', type=int, default=256, help='images per call')
  parser.add_argument('--size', type=int, default=112, help='input height and width')
  parser.add_argument('--channels', type=int, default=64, help='channels of the input')
  parser.add_argument(
    '--dtype', default='bfloat16', choices=('bfloat16', 'float32'), help="the input's dtype"
  )
  parser.add_argument('--steps', type=int, default=20, help='calls per timed window')
  parser.add_argument('--windows', type=int, default=5, help='timed windows (median)')
  parser.add_argument('--warmup', type=int, default=3, help='untimed calls first')
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  make_parser().parse_args()

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import bench_determinism
from models import pool

WINDOW, STRIDES, PADDING = (3, 3), (2, 2), ((1, 1), (1, 1))
POOLS = {
  'flax nnx.max_pool': lambda x: nnx.max_pool(x, WINDOW, STRIDES, PADDING),
  'models/pool.py': lambda x: pool.max_pool(x, WINDOW, STRIDES, PADDING),
}


def compiled_variants(x, cotangent):
  """{(pool, determinism): compiled gradient of sum(pool(x) * cotangent)}."""
  out = {}
  for name, fn in POOLS.items():
    grad = jax.jit(jax.grad(lambda v, g, fn=fn: jnp.sum((fn(v) * g).astype(jnp.float32))))
    lowered = grad.lower(x, cotangent)
    for mode, options in bench_determinism.VARIANTS.items():
      out[(name, mode)] = lowered.compile(options)
  return out


def runner(compiled, x, cotangent):
  def run(n):
    start, result = time.perf_counter(), None
    for _ in range(n):
      result = compiled(x, cotangent)
    jax.block_until_ready(result)
    return time.perf_counter() - start

  return run


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  if min(args.batch, args.size, args.channels, args.steps, args.windows) < 1:
    common.fail('--batch, --size, --channels, --steps and --windows must be positive')
  print(common.environment())
  print(common.command_line('bench_pool', argv))
  rng = np.random.default_rng(0)
  x = jnp.asarray(
    np.maximum(rng.standard_normal((args.batch, args.size, args.size, args.channels)), 0),
    args.dtype,
  )  # post-ReLU
  cotangent = jnp.asarray(
    rng.standard_normal(pool.max_pool(x, WINDOW, STRIDES, PADDING).shape), args.dtype
  )
  variants = compiled_variants(x, cotangent)
  times = common.alternate(
    {key: runner(c, x, cotangent) for key, c in variants.items()},
    args.warmup,
    args.windows,
    args.steps,
  )
  med = {key: statistics.median(t) * 1e3 for key, t in times.items()}
  print(
    f'{args.batch}x{args.size}x{args.size}x{args.channels} {args.dtype}, forward + backward; '
    f'median of {args.windows} alternating windows x {args.steps} calls'
  )
  print(
    '| pool | xla_gpu_deterministic_ops | ms/call (median; min-max) | vs flax, nondeterministic |'
  )
  print('|---|---|---|---|')
  reference = med[('flax nnx.max_pool', 'nondeterministic')]
  for (name, mode), t in times.items():
    ms = [v * 1e3 for v in t]
    print(
      f'| {name} | {mode} | {med[(name, mode)]:.3f} ({min(ms):.3f}-{max(ms):.3f}) | '
      f'{reference / med[(name, mode)]:.2f}x |'
    )
  print(f'pool_speedup={reference / med[("models/pool.py", "deterministic")]:.3f}')


if __name__ == '__main__':
  main()
