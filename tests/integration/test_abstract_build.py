"""The abstract build of a run (what sweeps/preflight.py compiles for a TPU) is the trainer's own
program: on the CPU, the steps lowered from the declared dataset (input_pipeline/__init__.py) and
the abstract state (train.abstract_state, run.abstract_batch) are the same HLO text as the steps
lowered from the loaded data and the initialised, placed state, phase by phase, evaluation
included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import input_pipeline
import models
from configs import common, validation
from models import layers
from numerics import ops
from numerics import setup as numerics_setup
from trainer import run, train


def resolved(spec, *overrides):
  config = validation.resolve(common.load(spec, list(overrides)))
  numerics_setup.configure(config)
  return config


@pytest.mark.parametrize('overrides', [(), (('numerics.profile', 'bf16_noise'),)])
def test_abstract_and_concrete_builds_lower_to_the_same_hlo(overrides):
  config = resolved('configs/digits.py:smoke', *overrides)
  concrete, abstract = run.build(config), run.build(config, input_pipeline.declared(config))
  state = train.initial_state(concrete, run.init_model(concrete)[0])
  shapes = train.abstract_state(abstract)
  assert run.is_abstract(shapes) and not run.is_abstract(state)
  for phase in concrete.phases:
    state, step = train.enter_phase(concrete, state, phase, phase.start)
    shapes, abstract_step = train.enter_phase(abstract, shapes, phase, phase.start)
    batch = next(run.batches(concrete, phase.start, phase.start + 1))
    text = step.lower(state, batch).as_text()
    assert (
      text
      == abstract_step.lower(
        shapes, run.abstract_batch(abstract, abstract.dataset.train, config.batch_size)
      ).as_text()
    )
    # and the step as a run calls it, its seed placed on the devices
    assert text == step.fn.lower(state, batch, step.placed_seed).as_text()
  totals = run.zero_sums(concrete.mesh)
  eval_batch = {**batch, 'mask': jax.device_put(jnp.ones(config.batch_size), concrete.sharded)}
  eval_text = train.eval_fn(concrete, state).lower(state, eval_batch, totals).as_text()
  assert (
    eval_text
    == train.eval_fn(abstract, shapes)
    .lower(
      shapes,
      run.abstract_batch(abstract, abstract.dataset.train, config.batch_size, mask=True),
      run.replicate(abstract, jax.eval_shape(lambda: totals)),
    )
    .as_text()
  )


def test_the_declared_digits_are_the_loaded_ones():
  config = resolved('configs/digits.py:smoke')
  loaded, made = run.load_dataset(config), input_pipeline.declared(config)
  for split in ('train', 'test'):
    a, b = getattr(loaded, split), getattr(made, split)
    assert (a.images.shape, a.images.dtype, a.labels.shape, a.labels.dtype) == (
      b.images.shape,
      b.images.dtype,
      b.labels.shape,
      b.labels.dtype,
    )
  assert (loaded.num_classes, loaded.task) == (made.num_classes, made.task)
  assert made.train.images.strides == (0, 0, 0, 0)  # no data behind the shape


def test_declared_celeba_sizes():
  config = resolved('configs/celeba.py:tpu')
  made = input_pipeline.declared(config)
  assert made.image_shape == (224, 224, 3) and made.num_classes == 10177
  # per identity: round half up of 202,599 x 0.2 to test (the rule of each identity's split)
  assert (len(made.train), len(made.test)) == (202599 - 40520, 40520)
  official = input_pipeline.declared(
    resolved('configs/celeba.py:tpu', ('data.split', 'official'), ('data.task', 'attributes'))
  )
  assert (len(official.train), len(official.test)) == (162770, 19962)
  assert official.task == 'multilabel' and official.train.labels.shape[1:] == (40,)


def test_a_step_traced_for_a_tpu_makes_the_tpus_choices_on_this_cpu():
  """The conv implementation and the emulation's fast form follow the platform a step is traced
  for (each layer's `platform`, which run.build sets from its mesh), not this process's backend."""
  assert ops.resolve_conv_impl('auto', macs=10**7) == 'im2col'  # this host: CPU
  assert ops.resolve_conv_impl('auto', 'tpu', macs=10**7) == 'xla'
  assert ops.resolve_impl('auto', 'tpu', 'bf16') == 'fast'
  assert ops.fast_plan('tf32', 'tpu').split
  assert ops.resolve_impl('auto', fmt='bf16') == 'reference'
  config = resolved('configs/digits.py:smoke')
  for platform in ('tpu', None):
    model = models.build(config, 10, 1, nnx.Rngs(0), platform)
    convs = [m for _, m in nnx.iter_modules(model) if isinstance(m, (layers.Conv2d, layers.Linear))]
    assert len(convs) == 21 and {m.platform for m in convs} == {platform}
  ctx = run.build(config, input_pipeline.declared(config))  # the mesh's devices: this host's CPU
  key = jax.random.key(0)
  built = nnx.eval_shape(
    lambda: nnx.merge(ctx.graphdef, nnx.state(run.create_model(config, ctx.dataset, key)))
  )
  assert {m.platform for _, m in nnx.iter_modules(built) if isinstance(m, layers.Conv2d)} == {'cpu'}


def test_the_seed_is_placed_once_at_the_first_call():
  mesh = run.make_mesh(jax.devices()[:2])
  replicated, _ = run.shardings(mesh)
  bound = run.Seeded(jax.jit(lambda x, seed: x + seed), np.asarray(7, np.uint32), replicated)
  assert 'placed_seed' not in vars(bound)
  assert int(bound(jnp.uint32(1))) == 8 and bound.placed_seed is vars(bound)['placed_seed']
