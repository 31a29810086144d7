"""Helpers of the divergence tests (tests/e2e/test_divergence*.py): the tiny settings and running
experiments/divergence's main."""

import os

import jax

from experiments import divergence
from tests.conftest import ROOT

SMOKE = os.path.join(ROOT, 'configs', 'digits.py') + ':smoke'


def run_main(argv):
  """divergence.main(argv), leaving the process-wide precision flag as it was."""
  before = jax.config.jax_default_matmul_precision
  try:
    return divergence.main(argv)
  finally:
    jax.config.update('jax_default_matmul_precision', before)
