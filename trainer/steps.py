"""The jitted train and eval steps, data parallel over a 1-D device mesh.

The training state is a plain pytree {'params', 'batch_stats', 'opt_state', 'step', 'sums'}:
replicated over the mesh, donated to each step. Batches are sharded along 'data'; under jit the
losses, accuracies and BatchNorm statistics are computed over the global batch. `sums` accumulates
the epoch's training loss/accuracy on device, so no step waits for the host.

Both steps trace the model inside numerics.ops.noise_scope with the key of (the run's data seed,
configs/common.py data_seed_of: config.seed unless data_seed is set; the state's global step;
'train' or 'eval'): the noise of a noisy product format (bf16_noise) depends on
nothing else, so a run repeats and resumes bit for bit (formats without noise never read the key,
and their compiled steps do not depend on the seed). An evaluation uses one key for all its
batches: the model it evaluates is perturbed one way. The seed is an argument of the compiled step
(a replicated uint32 scalar, bound by `Seeded`), so every seed of an arm shares one compilation.
See docs/numerics.md ("The noise control").
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from numerics import ops
from trainer import optim

ZERO_SUMS = {'loss': 0.0, 'correct': 0.0, 'count': 0.0}


def make_mesh(devices=None):
  """The 1-D 'data' mesh over `devices` (default: all), in the order given.

  Not jax.make_mesh: on TPUs it orders the devices into a ring (v4:2x2x1: 0, 2, 1, 3) and on a
  multi-host slice interleaves the hosts' devices (v4:2x2x2: hosts 0, 1, 0, 1, ...), so a process's
  devices would no longer hold the contiguous slice of each batch it loads (input_pipeline/
  batching.py process_slice); on CPU both give the same order (tests/test_mesh_and_optimizer.py).
  """
  devices = np.asarray(devices if devices is not None else jax.devices())
  return Mesh(devices, ('data',))


def shardings(mesh):
  """(replicated, batch-sharded) NamedShardings."""
  return NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))


def init_state(model, tx):
  """The state pytree of a freshly built nnx model and an optax optimizer."""
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return {
    'params': params,
    'batch_stats': nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)),
    'opt_state': tx.init(params),
    'step': jnp.zeros((), jnp.int32),
    'sums': jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), ZERO_SUMS),
  }


def preprocess(images, mean, std, flip_key=None):
  """uint8 NHWC -> normalised float32 on device; optional random horizontal flips."""
  x = (images.astype(jnp.float32) / 255.0 - mean) / std
  if flip_key is not None:
    flips = jax.random.bernoulli(flip_key, 0.5, (x.shape[0],))
    x = jnp.where(flips[:, None, None, None], x[:, :, ::-1, :], x)
  return x


def label_logits(logits, labels):
  """logits[i, labels[i]] without a gather (whose gradient is a scatter): the sum of the row
  masked to the label's one-hot, one nonzero term, hence exact. Labels index as optax's
  `jnp.take_along_axis` does: a negative label counts from the end, one out of range gives NaN."""
  num_classes = logits.shape[-1]
  labels = jnp.where(labels < 0, labels + num_classes, labels)
  hit = labels[..., None] == lax.broadcasted_iota(labels.dtype, logits.shape, logits.ndim - 1)
  picked = jnp.sum(jnp.where(hit, logits, jnp.zeros((), logits.dtype)), axis=-1)
  return jnp.where(jnp.any(hit, axis=-1), picked, jnp.full((), jnp.nan, logits.dtype))


def softmax_cross_entropy(logits, labels):
  """optax.softmax_cross_entropy_with_integer_labels(logits, labels) as logsumexp minus the
  label's logit (`label_logits`), as optax computes it, with no gather in the forward pass and
  no scatter in the backward pass (XLA's deterministic GPU mode sorts a scatter's indices).

  Values and gradients are optax's bit for bit (tests/integration/test_loss.py). The gradient is the
  same two terms as optax's, logsumexp's (softmax * g, by JAX's own rule) and -g at the label,
  summed after the first is rounded to f32, as optax's separate scatter kernel makes it: see
  `_cross_entropy_bwd`."""
  return _cross_entropy(logits, labels)


@jax.custom_vjp
def _cross_entropy(logits, labels):
  return jax.nn.logsumexp(logits, axis=-1) - label_logits(logits, labels)


def _cross_entropy_fwd(logits, labels):
  lse, lse_vjp = jax.vjp(lambda x: jax.nn.logsumexp(x, axis=-1), logits)
  return lse - label_logits(logits, labels), (lse_vjp, logits, labels)


def _cross_entropy_bwd(residuals, g):
  """softmax * g, rounded, then -g at the label. Left alone, XLA fuses the two into one kernel and
  contracts the product and the difference into a fused multiply-add (one rounding instead of
  two: 1 ulp off optax at the label). The select on NaN between them (NaN stays NaN, any other
  value passes unchanged) keeps the product rounded on its own: f32 has no 'round here' op that
  XLA keeps (reduce_precision to f32 and optimization_barrier were both tried, and dropped)."""
  lse_vjp, logits, labels = residuals
  (term,) = lse_vjp(g)
  term = jnp.where(jnp.isnan(term), jnp.full_like(term, jnp.nan), term)
  _, pick_vjp = jax.vjp(lambda x: label_logits(x, labels), logits)
  (picked,) = pick_vjp(g)
  return term - picked, None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def loss_and_correct(logits, labels, task):
  """Per-example (loss, number-correct-as-fraction) in float32."""
  logits = logits.astype(jnp.float32)
  if task == 'multilabel':
    labels = labels.astype(jnp.float32)
    loss = optax.sigmoid_binary_cross_entropy(logits, labels).mean(axis=-1)
    correct = ((logits > 0) == (labels > 0.5)).astype(jnp.float32).mean(axis=-1)
  else:
    loss = softmax_cross_entropy(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, correct


@dataclasses.dataclass(frozen=True)
class Seeded:
  """A jitted step whose last argument, the run seed, is bound: `step(*args)` calls
  `fn(*args, seed)`. `lower` and `compile` keep the binding (trainer/distributed.py precompiles
  through them); `as_text` shows the lowered module.

  Why not functools.partial over a device array: the seed must stay an argument of the compiled
  step (every seed of an arm shares one compilation), and a placed array cannot exist for
  compile-only devices (a TPU topology, sweeps/preflight.py); so the seed is lowered as its shape,
  dtype and sharding, and placed on the devices at the first call."""

  fn: Any
  seed: Any  # uint32 scalar (numpy)
  sharding: Any  # replicated over the mesh

  def __call__(self, *args):
    return self.fn(*args, self.placed_seed)

  @functools.cached_property
  def placed_seed(self):
    return jax.device_put(self.seed, self.sharding)

  def lower(self, *args):
    spec = jax.ShapeDtypeStruct(self.seed.shape, self.seed.dtype, sharding=self.sharding)
    return Seeded(self.fn.lower(*args, spec), self.seed, self.sharding)

  def compile(self, *args, **kwargs):
    return Seeded(self.fn.compile(*args, **kwargs), self.seed, self.sharding)

  def as_text(self):
    return self.fn.as_text()


def _bind_seed(fn, seed, replicated):
  return Seeded(fn, np.asarray(seed, np.uint32), replicated)


def _train_step(state, batch, seed, *, graphdef, tx, mask, task, mean, std, flip):
  flip_key = jax.random.fold_in(jax.random.key(seed), state['step']) if flip else None
  images = preprocess(batch['image'], mean, std, flip_key)

  def loss_fn(params):
    model = nnx.merge(graphdef, params, state['batch_stats'])
    model.train()
    logits = model(images)
    loss, correct = loss_and_correct(logits, batch['label'], task)
    return loss.mean(), (correct, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)))

  with ops.noise_scope(ops.step_noise_key(seed, state['step'], 'train')):
    (loss, (correct, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state['params']
    )
  params, opt_state = optim.masked_update(state['params'], grads, state['opt_state'], tx, mask)
  n = jnp.asarray(correct.shape[0], jnp.float32)
  sums = {
    'loss': state['sums']['loss'] + loss * n,
    'correct': state['sums']['correct'] + correct.sum(),
    'count': state['sums']['count'] + n,
  }
  return {
    'params': params,
    'batch_stats': batch_stats,
    'opt_state': opt_state,
    'step': state['step'] + 1,
    'sums': sums,
  }


def make_train_step(mesh, graphdef, tx, mask, task, mean, std, flip, seed, wrap=None):
  """jit(state, batch) -> state, with the state replicated and donated, the batch sharded.

  `wrap(fn)`, when given, wraps the step before jit (trainer/run.py fixes the numerics with it).
  """
  replicated, sharded = shardings(mesh)
  fn = functools.partial(
    _train_step,
    graphdef=graphdef,
    tx=tx,
    mask=mask,
    task=task,
    mean=jnp.asarray(mean),
    std=jnp.asarray(std),
    flip=flip,
  )
  jitted = jax.jit(
    wrap(fn) if wrap else fn,
    in_shardings=(replicated, sharded, replicated),
    out_shardings=replicated,
    donate_argnums=(0,),
  )
  return _bind_seed(jitted, seed, replicated)


def eval_logits(graphdef, state, seed, images, mean, std):
  """Eval-mode logits of uint8 `images` for `state` ({'params', 'batch_stats', 'step'}, at least),
  in the noise of the key (seed, state's step, 'eval'): the evaluation's forward pass, one for the
  eval step and for experiments/divergence_lockstep.py."""
  model = nnx.merge(graphdef, state['params'], state['batch_stats'])
  model.eval()
  with ops.noise_scope(ops.step_noise_key(seed, state['step'], 'eval')):
    return model(preprocess(images, mean, std))


def example_outputs(logits, labels, task):
  """Per-example outputs of eval-mode `logits` (float32): classification: the predicted class
  (argmax, as `loss_and_correct` counts it), the softmax probability of that class and of the
  label; multilabel: each label's predicted bit (logit > 0) and sigmoid probability of 1."""
  logits = logits.astype(jnp.float32)
  if task == 'multilabel':
    return {'predicted': (logits > 0).astype(jnp.int8), 'probability': jax.nn.sigmoid(logits)}
  predicted = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  probs = jax.nn.softmax(logits, axis=-1)
  return {
    'predicted': predicted,
    'p_predicted': label_logits(probs, predicted),
    'p_label': label_logits(probs, labels),
  }


def _eval_step(state, batch, totals, seed, *, graphdef, task, mean, std):
  logits = eval_logits(graphdef, state, seed, batch['image'], mean, std)
  loss, correct = loss_and_correct(logits, batch['label'], task)
  mask = batch['mask']
  totals = {
    'loss': totals['loss'] + (loss * mask).sum(),
    'correct': totals['correct'] + (correct * mask).sum(),
    'count': totals['count'] + mask.sum(),
  }
  return totals, example_outputs(logits, batch['label'], task)


def make_eval_step(mesh, graphdef, task, mean, std, seed, wrap=None):
  """jit(state, batch, totals) -> (totals, outputs): masked sums, so every example counts exactly
  once, and the batch's per-example outputs (`example_outputs`, padding included), replicated: an
  all-gather on the devices, so every process can read the whole batch's outputs."""
  replicated, sharded = shardings(mesh)
  fn = functools.partial(
    _eval_step, graphdef=graphdef, task=task, mean=jnp.asarray(mean), std=jnp.asarray(std)
  )
  jitted = jax.jit(
    wrap(fn) if wrap else fn,
    in_shardings=(replicated, sharded, replicated, replicated),
    out_shardings=(replicated, replicated),
    donate_argnums=(2,),
  )
  return _bind_seed(jitted, seed, replicated)


def _gather(data, indices):
  return {'image': data['image'][indices], 'label': data['label'][indices]}


def make_gather(mesh):
  """jit(data, indices) -> batch: a training batch gathered from a device-resident split.

  `data` is the split replicated on every device (batching.on_devices), `indices` the global
  batch's rows sharded along 'data'; each device gathers its own rows, so the batch comes out
  sharded exactly like a host-fed one, with the same uint8 values.
  """
  replicated, sharded = shardings(mesh)
  return jax.jit(_gather, in_shardings=(replicated, sharded), out_shardings=sharded)


def _all_finite(bad, state):
  """Keep (first non-finite step, what) on device: no host sync per step.

  `what` is a bit mask: 1 = the accumulated training loss, 2 = the parameters or BatchNorm
  statistics (non-finite gradients reach the parameters through the optimizer update).
  """
  loss_ok = jnp.isfinite(state['sums']['loss'])
  leaves = jax.tree.leaves((state['params'], state['batch_stats']))
  state_ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
  what = (~loss_ok).astype(jnp.int32) + 2 * (~state_ok).astype(jnp.int32)
  first = (bad[0] < 0) & (what > 0)
  return jnp.where(first, jnp.stack([state['step'].astype(jnp.int32), what]), bad)


def make_watch(mesh):
  """jit(bad, state) -> bad, run after every train step: `bad` is [first bad step, what] on device
  ([-1, 0] while every value is finite), read by the host only at log/checkpoint points. Not
  donated: the loop keeps the last few as markers of its steps in flight (trainer/stop.InFlight)."""
  replicated, _ = shardings(mesh)
  return jax.jit(_all_finite, in_shardings=(replicated, replicated), out_shardings=replicated)


def no_bad_step(mesh):
  """The initial `bad` of make_watch: no non-finite value seen."""
  return jax.device_put(np.array([-1, 0], np.int32), shardings(mesh)[0])


def zero_sums(mesh):
  replicated, _ = shardings(mesh)
  return jax.device_put(jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), ZERO_SUMS), replicated)
