"""The train and eval steps lower without scatter, select_and_scatter or sort.

XLA's deterministic GPU mode (`numerics.gpu_deterministic`, --xla_gpu_deterministic_ops) sorts a
scatter's indices and serialises it: on an H100 the stem's max-pool gradient and the loss's
gradient made the deterministic step 2x slower (BENCHMARKS.md). models/layers.py (max_pool) and
trainer/train.py replace both with dense ops; this file keeps every config of the project so.

Lowering only traces (no compile, nothing runs), at a small width, image size and batch: which
operations the step holds depends on the stem, the task, the product formats, the emulation
implementation, the activation dtype and BatchNorm grouping, not on the sizes. Covered: every
preset of configs/digits.py and configs/celeba.py with its own numerics, every profile of
numerics/formats.py on the ImageNet stem (f32 activations with the fast emulation, bf16
activations with the reference one), per-core BatchNorm, the CelebA attributes task, random
flips; one train step is also compiled for the CPU and its HLO checked.
"""

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from configs import celeba, digits
from numerics import formats
from tests.support.lowering import FORBIDDEN_HLO, forbidden_ops, lowered_steps

PRESETS = [f'configs/digits.py:{p}' for p in digits.PRESETS if not p.startswith('_')] + [
  f'configs/celeba.py:{p}' for p in celeba.PRESETS if not p.startswith('_')
]


@pytest.mark.parametrize('spec', PRESETS)
def test_every_preset_lowers_without_scatter_or_sort(spec, keep_matmul_precision):
  train, evaluate = lowered_steps(spec)
  assert forbidden_ops(train) == [] and forbidden_ops(evaluate) == []


@pytest.mark.parametrize('profile', list(formats.PROFILES))
def test_every_profile_lowers_without_scatter_or_sort(profile, keep_matmul_precision):
  """On the ImageNet stem: f32 activations with the fast emulation (what GPUs and TPUs run), bf16
  activations with the reference one (what CPUs run); the train step, whose forward pass holds
  the eval step's products."""
  for dtype, impl in (('float32', 'fast'), ('bfloat16', 'reference')):
    overrides = [
      ('numerics.profile', profile),
      ('numerics.compute_dtype', dtype),
      ('numerics.emulate_impl', impl),
    ]
    train, _ = lowered_steps('configs/celeba.py', overrides, lower_eval=False)
    assert forbidden_ops(train) == [], overrides


def test_attributes_grouped_batchnorm_and_flips_lower_without_scatter_or_sort(
  keep_matmul_precision,
):
  overrides = [('data.task', 'attributes'), ('numerics.batchnorm_group', 2), ('data.flip', True)]
  train, evaluate = lowered_steps('configs/celeba.py', overrides, task='multilabel')
  assert forbidden_ops(train) == [] and forbidden_ops(evaluate) == []


def test_the_check_sees_what_it_looks_for():
  """The forbidden ops, in the text this test reads: flax's max pool gradient and optax's loss."""
  x = jnp.zeros((2, 8, 8, 3))
  pool_grad = jax.jit(jax.grad(lambda v: jnp.sum(nnx.max_pool(v, (3, 3), (2, 2), 'SAME'))))
  assert forbidden_ops(pool_grad.lower(x)) == ['select_and_scatter']
  loss_grad = jax.jit(
    jax.grad(
      lambda v: optax.softmax_cross_entropy_with_integer_labels(v, jnp.zeros((2,), jnp.int32)).sum()
    )
  )
  assert 'scatter' in forbidden_ops(loss_grad.lower(jnp.zeros((2, 10))))


def test_compiled_cpu_step_has_no_scatter_or_sort(keep_matmul_precision):
  """XLA:CPU adds none in compiling the ImageNet-stem train step (~10 s without the test
  compilation cache; the GPU-compiled step: tests/gpu)."""
  train, _ = lowered_steps('configs/celeba.py:gpu', [('data.image_size', 8)], lower_eval=False)
  assert FORBIDDEN_HLO.findall(train.compile().as_text()) == []
