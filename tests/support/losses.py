"""trainer/train.py's cross-entropy against optax's, bit for bit: the checks the CPU suite
(tests/integration/test_loss.py) and the GPU tier (tests/gpu) both run."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from trainer import train


def bits(a):
  return np.asarray(a).view(np.uint32)


def mean_loss(loss_fn):
  return lambda logits, labels: jnp.mean(loss_fn(logits, labels))


def assert_gradients_agree(ours, theirs):
  """Bit-identical everywhere, the label's entry included (trainer/train.py rounds softmax * g
  before subtracting g there, as optax's scatter kernel does)."""
  np.testing.assert_array_equal(bits(ours), bits(theirs))


def assert_cross_entropy_equals_optax(num_classes, scale):
  """Forward bit for bit; gradient (of the batch mean, as the train step takes it) as
  assert_gradients_agree says. Large scales make logsumexp's max shift matter."""
  rng = np.random.default_rng(num_classes)
  logits = jnp.asarray(scale * rng.standard_normal((64, num_classes)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, num_classes, 64), jnp.int32)
  ours, theirs = train.softmax_cross_entropy, optax.softmax_cross_entropy_with_integer_labels
  np.testing.assert_array_equal(
    bits(jax.jit(ours)(logits, labels)), bits(jax.jit(theirs)(logits, labels))
  )

  def grad(fn):
    return jax.jit(jax.grad(mean_loss(fn)))(logits, labels)

  assert_gradients_agree(grad(ours), grad(theirs))


def assert_signed_zero_and_extreme_label_logits_as_optax():
  logits = jnp.asarray([[-0.0, 1.0, 2.0], [0.0, -0.0, -1e30], [3e38, -3e38, 0.0]], jnp.float32)
  labels = jnp.asarray([0, 1, 1], jnp.int32)
  ours = jax.value_and_grad(mean_loss(train.softmax_cross_entropy))(logits, labels)
  theirs = jax.value_and_grad(mean_loss(optax.softmax_cross_entropy_with_integer_labels))(
    logits, labels
  )
  np.testing.assert_array_equal(bits(ours[0]), bits(theirs[0]))
  assert_gradients_agree(ours[1], theirs[1])
