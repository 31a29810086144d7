"""The GPU tier: what only a GPU can show. CI (CPU) collects it and skips it; on a GPU machine:

  GPU_TESTS=1 python -m pytest tests/gpu -q

(README, Performance; BENCHMARKS.md.) With GPU_TESTS=1, tests/conftest.py leaves JAX's platform
alone and this module puts --xla_gpu_deterministic_ops=true in XLA_FLAGS before JAX starts, as
`numerics.gpu_deterministic=True` does for a run (configs/*.py:gpu): every step here compiles
deterministically unless a test asks otherwise for one compilation (JAX's `compiler_options`, as
bench_step --mode determinism does). Run this folder alone: the CPU suite assumes the CPU.
About two minutes on an H100 (the speed comparison compiles the 224^2 step twice).
"""

import argparse
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from benchmarks import bench_step
from configs import common, validation
from experiments import numerics_probe
from tests.conftest import GPU_TIER
from tests.support import losses, lowering, pools

if GPU_TIER:  # before the backend starts: collection imports this module before any test runs
  os.environ['XLA_FLAGS'] = os.environ.get('XLA_FLAGS', '') + ' --xla_gpu_deterministic_ops=true'

pytestmark = pytest.mark.skipif(
  not GPU_TIER,
  reason='GPU tier: run `GPU_TESTS=1 python -m pytest tests/gpu` on a machine with a GPU',
)
OPTION = bench_step.OPTION


@pytest.fixture(scope='module', autouse=True)
def on_a_gpu():
  if jax.default_backend() != 'gpu':
    pytest.fail(
      f'GPU_TESTS=1, but JAX runs on {jax.default_backend()}: run the tier where '
      'jax[cuda] sees a GPU (and JAX_PLATFORMS is unset)'
    )


def test_the_deterministic_option_reaches_the_gpu_compiler():
  """flax's max-pool gradient (a select_and_scatter) compiles differently with and without
  deterministic ops, and XLA_FLAGS turned them on: so the steps below compile deterministically
  and the speed comparison compares two different programs."""
  x = jnp.zeros((8, 56, 56, 64), jnp.bfloat16)
  grad = jax.grad(lambda v: jnp.sum(pools.flax_pool(v).astype(jnp.float32)))
  lowered = jax.jit(grad).lower(x)

  def ops(*options):
    return bench_step.scatter_and_sort_ops(lowered.compile(*options))

  deterministic, other = ops({OPTION: True}), ops({OPTION: False})
  assert deterministic != other and ops() == deterministic, (deterministic, other)


@pytest.mark.parametrize(
  'spec,overrides',
  [
    ('configs/celeba.py:gpu', []),
    ('configs/digits.py:gpu', []),
    (
      'configs/celeba.py:gpu',
      [('numerics.compute_dtype', 'bfloat16'), ('numerics.profile', 'jax_gpu_default')],
    ),
  ],
)
def test_compiled_gpu_steps_have_no_scatter_or_sort(spec, overrides):
  train, evaluate = lowering.lowered_steps(spec, overrides)
  assert lowering.FORBIDDEN_HLO.findall(train.compile().as_text()) == []
  assert lowering.FORBIDDEN_HLO.findall(evaluate.compile().as_text()) == []


def test_gpu_deterministic_steps_repeat_bit_for_bit():
  """configs/celeba.py:gpu (gpu_deterministic=True) at 64^2: five steps (flips on, bf16
  activations) from one state, twice, give bit-identical states."""
  config = validation.resolve(
    common.load(
      'configs/celeba.py:gpu',
      [
        ('data.image_size', 64),
        ('batch_size', 64),
        ('data.flip', True),
        ('numerics.compute_dtype', 'bfloat16'),
      ],
    )
  )
  bench = bench_step.JaxStep(config, jax.devices()[:1])
  assert bench_step.repeats_identically(bench, bench.step, 5)


def test_deterministic_step_within_5_percent_of_the_nondeterministic_one():
  """The study's GPU step (224^2, batch 256, bf16): the one speed assertion of the issue; the
  benchmark (bench_step --mode determinism) reports the same ratio at batch 256 and 2048."""
  config = validation.resolve(
    common.load(
      'configs/celeba.py:gpu',
      [('data.image_size', 224), ('batch_size', 256), ('numerics.compute_dtype', 'bfloat16')],
    )
  )
  args = argparse.Namespace(
    steps=10, windows=5, warmup=3, repeat_steps=2, num_classes=1000, devices=1
  )
  bench, results, _ = bench_step.determinism_measure(args, config)
  text, ratios = bench_step.determinism_table(bench, results, args)
  assert results['deterministic']['repeats'] and ratios['deterministic'] >= 0.95, text


# Worst relative L2 difference allowed per numerics_probe pair (matmuls, layers), with what an H100
# measured (BENCHMARKS.md): the emulated formats reproduce the hardware's dot products to f32
# summation order, tf32 also to ties (the hardware rounds them away from zero, emulation to even).
# Layers against a native setting are not compared: presets set dots only (convolutions then run
# at 'default'), and under 'default' cuDNN runs some shapes in f32 (conv1).
PAIR_BOUNDS = {
  'fast:bf16 vs BF16_BF16_F32': (1e-6, None),  # 0
  'emu:bf16 vs BF16_BF16_F32': (1e-6, None),  # 1.8e-7
  'fast:tf32 vs TF32_TF32_F32': (3e-5, None),  # 1.05e-5
  'emu:tf32 vs TF32_TF32_F32': (3e-5, None),  # 1.05e-5
  'fast:tf32 vs default': (3e-5, None),  # 1.05e-5 (an H100's default is TF32)
  'emu:f32 vs highest': (1e-6, 1e-6),  # 0, 0
  'fast:bf16 vs emu:bf16': (1e-6, 2e-5),  # 1.8e-7, 3.8e-6
  'fast:bf16_3x vs emu:bf16_3x': (1e-6, 2e-5),  # 1.8e-7, 3.8e-6
  'fast:tf32 vs emu:tf32': (2e-6, 3e-5),  # 4.3e-7, 8.4e-6
}
# Native TF32 dots that deterministic ops (this tier's XLA_FLAGS) run in full f32: an H200 with
# jax 0.11.2 does so for K = 64, 128 and 147 under 'default' and even under TF32_TF32_F32, and
# uses TF32 from K = 256 (BENCHMARKS.md, "Deterministic ops and TF32"); without the flag every K
# runs TF32.
TF32_NATIVE = ('TF32_TF32_F32', 'default')


def test_fast_emulation_equals_the_native_hardware_products():
  """experiments.numerics_probe's product pairs (its defaults: every ResNet-18 reduction length
  and convolution shape), as assertions. A native TF32 matmul is either the TF32 emulation's
  product or, where deterministic ops fall back to f32, 'highest''s, nothing else; the fallbacks
  are printed."""
  settings = list(numerics_probe.SETTINGS)
  args = types.SimpleNamespace(rows=128, cols=64, classes=1000, conv_spatial=4, conv_batch=2)
  _, _, outs, names = numerics_probe.measure_products(settings, args, np.random.default_rng(0))
  rows = {r['pair']: r for r in numerics_probe.pair_diffs(outs, {}, settings, names)}
  assert set(PAIR_BOUNDS) <= set(rows), sorted(rows)
  f32_fallbacks = []
  for pair, (matmuls, layers) in PAIR_BOUNDS.items():
    a, b = pair.split(' vs ')
    for i, name in enumerate(names):
      if not name.startswith('K='):
        continue
      diff = numerics_probe.rel_err(outs[a][i], outs[b][i])
      if b in TF32_NATIVE and numerics_probe.rel_err(outs[b][i], outs['highest'][i]) <= 1e-6:
        f32_fallbacks.append(f'{b} {name}')
        continue
      assert diff <= matmuls, (pair, name, diff, rows[pair])
    assert layers is None or rows[pair]['layers'] <= layers, rows[pair]
  fallbacks = sorted(set(f32_fallbacks)) or 'none'
  print('native TF32 dots run in f32 under deterministic ops:', fallbacks)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_pool_matches_flax_on_the_gpu(dtype):
  """Forward bit for bit and the tie rule (random, tied, signed-zero, -inf, NaN inputs; odd and
  even sizes); integer cotangents, so that sums of several windows' shares are exact whatever
  order the GPU adds them in."""
  rng = np.random.default_rng(0)
  for hw in [(112, 112), (9, 6)]:
    for kind in pools.KINDS:
      x = jnp.asarray(pools.inputs(kind, (4,) + hw + (8,), dtype, rng), dtype)
      cotangent = jnp.asarray(rng.integers(-3, 4, pools.output_shape(x)), dtype)
      pools.assert_same_as_flax(x, cotangent)


def test_loss_matches_optax_on_the_gpu():
  for num_classes, scale in [(10, 1.0), (1000, 30.0), (7, 1e4)]:
    losses.assert_cross_entropy_equals_optax(num_classes, scale)
  losses.assert_signed_zero_and_extreme_label_logits_as_optax()


def test_the_tier_runs_flax_modules_on_the_gpu():
  """The model's parameters live on the GPU (no silent CPU fallback)."""
  layer = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
  assert next(iter(layer.kernel[...].devices())).platform == 'gpu'
