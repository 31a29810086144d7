"""The train and eval steps of a config lowered for abstract state and batches at a small size
(nothing runs), and the check for scatter, select_and_scatter and sort in their text."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import input_pipeline
import models
from benchmarks import bench_step
from configs import common, validation
from trainer import run, train

# Small enough to trace in about a second; the stems keep their structure (the ImageNet stem's
# max pool runs on a 4x4 map at 16^2).
# numerics.gpu_deterministic is an XLA flag of the GPU compiler, read when the backend starts,
# after lowering: off here, as this process's backend has started without it.
SMALL = [
  ('model.width', 0.125),
  ('data.image_size', 16),
  ('batch_size', 8),
  ('eval_batch_size', 8),
  ('numerics.gpu_deterministic', False),
]
FORBIDDEN = re.compile(r'stablehlo\.(scatter|select_and_scatter|sort)\b')
FORBIDDEN_HLO = re.compile(r'\b(scatter|select-and-scatter|sort)\(')


def synthetic(config, task):
  """A one-batch random dataset for `config` (3 channels), classification or multilabel."""
  dataset = bench_step.synthetic_dataset(config, num_classes=10)
  if task == 'classification':
    return dataset
  labels = np.random.default_rng(0).integers(0, 2, (len(dataset.train), 40), dtype=np.int32)
  split = input_pipeline.Split(dataset.train.images, labels)
  return input_pipeline.Dataset('synthetic', split, split, 40, task='multilabel')


def lowered_steps(spec, overrides=(), task='classification', lower_eval=True):
  """(train, eval) steps of `spec` (configs/common.py) lowered for abstract state and batches:
  the train step of the phase where every parameter trains, through the run context (eval None
  unless `lower_eval`)."""
  fields = dict(SMALL) | dict(overrides)  # `overrides` replace SMALL's (a field given once)
  config = validation.resolve(common.load(spec, list(fields.items())))
  ctx = run.build(config, synthetic(config, task), jax.devices()[:1])
  phase = next(p for p in ctx.phases if not p.frozen)
  state = jax.eval_shape(
    lambda: train.create_train_state(
      models.build(config, ctx.dataset.num_classes, 3, nnx.Rngs(params=0)),
      run.optimizer(ctx, phase),
    )
  )
  # Entered inside the phase (start + 1): the optimizer state is kept, nothing is computed.
  _, step = train.enter_phase(ctx, state, phase, phase.start + 1)
  train_batch = run.abstract_batch(ctx, ctx.dataset.train, config.batch_size)
  if not lower_eval:
    return step.lower(state, train_batch), None
  eval_batch = run.abstract_batch(ctx, ctx.dataset.test, config.eval_batch_size, mask=True)
  totals = jax.eval_shape(
    lambda: jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), run.ZERO_SUMS)
  )
  return (
    step.lower(state, train_batch),
    train.eval_fn(ctx, state).lower(state, eval_batch, totals),
  )


def forbidden_ops(lowered):
  """The scatter/sort operations in a lowered step's StableHLO text (empty: none)."""
  return FORBIDDEN.findall(lowered.as_text())
