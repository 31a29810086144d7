"""trainer/train.py's cross-entropy: optax's values and gradients bit for bit, without gather or
scatter."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.support import losses
from tests.support.losses import bits, mean_loss
from trainer import train


@pytest.mark.parametrize('num_classes,scale', [(10, 1.0), (1000, 30.0), (7, 1e4)])
def test_cross_entropy_equals_optax(num_classes, scale):
  losses.assert_cross_entropy_equals_optax(num_classes, scale)


def test_labels_out_of_range_index_as_optax_does():
  """-1 counts from the end (numpy indexing); 10 of 10 classes gives NaN, as optax's gather."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.standard_normal((4, 10)), jnp.float32)
  labels = jnp.asarray([3, -1, 10, -11], jnp.int32)
  ours = train.softmax_cross_entropy(logits, labels)
  theirs = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  np.testing.assert_array_equal(bits(ours), bits(theirs))
  assert np.isnan(np.asarray(ours)[2:]).all() and np.isfinite(np.asarray(ours)[:2]).all()


def test_signed_zero_and_extreme_label_logits():
  losses.assert_signed_zero_and_extreme_label_logits_as_optax()


def test_loss_gradient_lowers_without_gather_or_scatter():
  logits = jnp.zeros((8, 10), jnp.float32)
  labels = jnp.zeros((8,), jnp.int32)

  def lowered(fn):
    return jax.jit(jax.grad(mean_loss(fn))).lower(logits, labels).as_text()

  assert re.search(
    r'stablehlo\.scatter\b', lowered(optax.softmax_cross_entropy_with_integer_labels)
  )
  assert not re.search(r'stablehlo\.(gather|scatter|sort)\b', lowered(train.softmax_cross_entropy))
