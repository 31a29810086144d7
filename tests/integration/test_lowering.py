"""The train and eval steps lower without scatter, select_and_scatter or sort.

XLA's deterministic GPU mode (`numerics.gpu_deterministic`, --xla_gpu_deterministic_ops) sorts a
scatter's indices and serialises it: on an H100 the stem's max-pool gradient and the loss's
gradient made the deterministic step 2x slower (BENCHMARKS.md). models/pool.py and
trainer/steps.py replace both with dense ops; this file keeps every config of the project so.

Lowering only traces (no compile, nothing runs), at a small width, image size and batch: which
operations the step holds depends on the stem, the task, the product formats, the emulation
implementation, the activation dtype and BatchNorm grouping, not on the sizes. Covered: every
preset of configs/digits.py and configs/celeba.py with its own numerics, every profile of
numerics/profiles.py on the ImageNet stem (f32 activations with the fast emulation, bf16
activations with the reference one), per-core BatchNorm, the CelebA attributes task, random
flips; one train step is also compiled for the CPU and its HLO checked.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from benchmarks import bench_step
from configs import celeba, digits, loader
from input_pipeline import base
from models import resnet
from numerics import profiles
from tests.e2e.test_benchmarks import keep_matmul_precision  # noqa: F401 (a fixture)
from trainer import run, steps, validation

# Small enough to trace in about a second; the stems keep their structure (the ImageNet stem's
# max pool runs on a 4x4 map at 16^2).
# numerics.gpu_deterministic is an XLA flag of the GPU compiler, read when the backend starts,
# after lowering: off here, as this process's backend has started without it.
SMALL = [('model.width', 0.125), ('data.image_size', 16), ('batch_size', 8),
         ('eval_batch_size', 8), ('numerics.gpu_deterministic', False)]
FORBIDDEN = re.compile(r'stablehlo\.(scatter|select_and_scatter|sort)\b')
FORBIDDEN_HLO = re.compile(r'\b(scatter|select-and-scatter|sort)\(')


def synthetic(config, task):
  """A one-batch random dataset for `config` (3 channels), classification or multilabel."""
  dataset = bench_step.synthetic_dataset(config, num_classes=10)
  if task == 'classification':
    return dataset
  labels = np.random.default_rng(0).integers(0, 2, (len(dataset.train), 40), dtype=np.int32)
  split = base.Split(dataset.train.images, labels)
  return base.Dataset('synthetic', split, split, 40, task='multilabel')


def lowered_steps(spec, overrides=(), task='classification', lower_eval=True):
  """(train, eval) steps of `spec` (configs/loader.py) lowered for abstract state and batches:
  the train step of the phase where every parameter trains, through the run context (eval None
  unless `lower_eval`)."""
  fields = dict(SMALL) | dict(overrides)  # `overrides` replace SMALL's (a field given once)
  config = validation.resolve(loader.load(spec, list(fields.items())))
  ctx = run.build(config, synthetic(config, task), jax.devices()[:1])
  phase = next(p for p in ctx.phases if not p.frozen)
  state = jax.eval_shape(lambda: steps.init_state(
      resnet.create_model(config, ctx.dataset.num_classes, 3, nnx.Rngs(params=0)),
      run.optimizer(ctx, phase)))
  # Entered inside the phase (start + 1): the optimizer state is kept, nothing is computed.
  _, train = run.enter_phase(ctx, state, phase, phase.start + 1)
  train_batch = run.abstract_batch(ctx, ctx.dataset.train, config.batch_size)
  if not lower_eval:
    return train.lower(state, train_batch), None
  eval_batch = run.abstract_batch(ctx, ctx.dataset.test, config.eval_batch_size, mask=True)
  totals = jax.eval_shape(lambda: jax.tree.map(lambda v: jnp.asarray(v, jnp.float32),
                                               steps.ZERO_SUMS))
  return (train.lower(state, train_batch),
          run.eval_step(ctx, state).lower(state, eval_batch, totals))


def forbidden_ops(lowered):
  """The scatter/sort operations in a lowered step's StableHLO text (empty: none)."""
  return FORBIDDEN.findall(lowered.as_text())


PRESETS = [f'configs/digits.py:{p}' for p in digits.PRESETS if not p.startswith('_')] + [
    f'configs/celeba.py:{p}' for p in celeba.PRESETS if not p.startswith('_')]


@pytest.mark.parametrize('spec', PRESETS)
def test_every_preset_lowers_without_scatter_or_sort(spec, keep_matmul_precision):
  train, evaluate = lowered_steps(spec)
  assert forbidden_ops(train) == [] and forbidden_ops(evaluate) == []


@pytest.mark.parametrize('profile', list(profiles.PROFILES))
def test_every_profile_lowers_without_scatter_or_sort(profile, keep_matmul_precision):
  """On the ImageNet stem: f32 activations with the fast emulation (what GPUs and TPUs run), bf16
  activations with the reference one (what CPUs run); the train step, whose forward pass holds
  the eval step's products."""
  for dtype, impl in (('float32', 'fast'), ('bfloat16', 'reference')):
    overrides = [('numerics.profile', profile), ('numerics.compute_dtype', dtype),
                 ('numerics.emulate_impl', impl)]
    train, _ = lowered_steps('configs/celeba.py', overrides, lower_eval=False)
    assert forbidden_ops(train) == [], overrides


def test_attributes_grouped_batchnorm_and_flips_lower_without_scatter_or_sort(
    keep_matmul_precision):
  overrides = [('data.task', 'attributes'), ('numerics.batchnorm_group', 2), ('data.flip', True)]
  train, evaluate = lowered_steps('configs/celeba.py', overrides, task='multilabel')
  assert forbidden_ops(train) == [] and forbidden_ops(evaluate) == []


def test_the_check_sees_what_it_looks_for():
  """The forbidden ops, in the text this test reads: flax's max pool gradient and optax's loss."""
  x = jnp.zeros((2, 8, 8, 3))
  pool_grad = jax.jit(jax.grad(lambda v: jnp.sum(nnx.max_pool(v, (3, 3), (2, 2), 'SAME'))))
  assert forbidden_ops(pool_grad.lower(x)) == ['select_and_scatter']
  loss_grad = jax.jit(jax.grad(lambda v: optax.softmax_cross_entropy_with_integer_labels(
      v, jnp.zeros((2,), jnp.int32)).sum()))
  assert 'scatter' in forbidden_ops(loss_grad.lower(jnp.zeros((2, 10))))


def test_compiled_cpu_step_has_no_scatter_or_sort(keep_matmul_precision):
  """XLA:CPU adds none in compiling the ImageNet-stem train step (~10 s without the test
  compilation cache; the GPU-compiled step: tests/gpu)."""
  train, _ = lowered_steps('configs/celeba.py:gpu', [('data.image_size', 8)], lower_eval=False)
  assert FORBIDDEN_HLO.findall(train.compile().as_text()) == []
