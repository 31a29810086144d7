"""trainer/steps.py's cross-entropy: optax's values and gradients bit for bit, without gather or
scatter."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from trainer import steps


def bits(a):
  return np.asarray(a).view(np.uint32)


def mean_loss(loss_fn):
  return lambda logits, labels: jnp.mean(loss_fn(logits, labels))


def assert_gradients_agree(ours, theirs, labels):  # pylint: disable=unused-argument
  """Bit-identical everywhere, the label's entry included (trainer/steps.py rounds softmax * g
  before subtracting g there, as optax's scatter kernel does)."""
  np.testing.assert_array_equal(bits(ours), bits(theirs))


@pytest.mark.parametrize('num_classes,scale', [(10, 1.0), (1000, 30.0), (7, 1e4)])
def test_cross_entropy_equals_optax(num_classes, scale):
  """Forward bit for bit; gradient (of the batch mean, as the train step takes it) as
  assert_gradients_agree says. Large scales make logsumexp's max shift matter."""
  rng = np.random.default_rng(num_classes)
  logits = jnp.asarray(scale * rng.standard_normal((64, num_classes)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, num_classes, 64), jnp.int32)
  ours, theirs = steps.softmax_cross_entropy, optax.softmax_cross_entropy_with_integer_labels
  np.testing.assert_array_equal(bits(jax.jit(ours)(logits, labels)),
                                bits(jax.jit(theirs)(logits, labels)))
  grad = lambda fn: jax.jit(jax.grad(mean_loss(fn)))(logits, labels)
  assert_gradients_agree(grad(ours), grad(theirs), labels)


def test_labels_out_of_range_index_as_optax_does():
  """-1 counts from the end (numpy indexing); 10 of 10 classes gives NaN, as optax's gather."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.standard_normal((4, 10)), jnp.float32)
  labels = jnp.asarray([3, -1, 10, -11], jnp.int32)
  ours = steps.softmax_cross_entropy(logits, labels)
  theirs = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  np.testing.assert_array_equal(bits(ours), bits(theirs))
  assert np.isnan(np.asarray(ours)[2:]).all() and np.isfinite(np.asarray(ours)[:2]).all()


def test_signed_zero_and_extreme_label_logits():
  logits = jnp.asarray([[-0.0, 1.0, 2.0], [0.0, -0.0, -1e30], [3e38, -3e38, 0.0]], jnp.float32)
  labels = jnp.asarray([0, 1, 1], jnp.int32)
  ours = jax.value_and_grad(mean_loss(steps.softmax_cross_entropy))(logits, labels)
  theirs = jax.value_and_grad(mean_loss(optax.softmax_cross_entropy_with_integer_labels))(
      logits, labels)
  np.testing.assert_array_equal(bits(ours[0]), bits(theirs[0]))
  assert_gradients_agree(ours[1], theirs[1], labels)


def test_loss_gradient_lowers_without_gather_or_scatter():
  logits = jnp.zeros((8, 10), jnp.float32)
  labels = jnp.zeros((8,), jnp.int32)
  lowered = lambda fn: jax.jit(jax.grad(mean_loss(fn))).lower(logits, labels).as_text()
  assert re.search(r'stablehlo\.scatter\b',
                   lowered(optax.softmax_cross_entropy_with_integer_labels))
  assert not re.search(r'stablehlo\.(gather|scatter|sort)\b', lowered(steps.softmax_cross_entropy))
