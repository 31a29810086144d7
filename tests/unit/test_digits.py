"""The digits without importing scikit-learn: its data file and its stratified split, equal to
sklearn.datasets.load_digits and model_selection.train_test_split."""

import subprocess
import sys

import numpy as np
import pytest
from sklearn import datasets, model_selection

from input_pipeline import digits


def test_the_images_and_labels_are_load_digits():
  images, labels = digits.load_digits()
  reference = datasets.load_digits()
  np.testing.assert_array_equal(images, reference.images)
  np.testing.assert_array_equal(labels, reference.target)
  assert images.dtype == reference.images.dtype


@pytest.mark.parametrize('fraction', [0.2, 0.25, 0.1, 0.5, 0.37])
def test_the_split_is_train_test_split_for_every_seed(fraction):
  _, labels = digits.load_digits()
  n_test = int(np.ceil(len(labels) * fraction))
  for seed in range(25):
    train, test = digits.stratified_split(labels, n_test, seed)
    ref_train, ref_test = model_selection.train_test_split(
      np.arange(len(labels)), test_size=fraction, stratify=labels, random_state=seed
    )
    np.testing.assert_array_equal(train, np.sort(ref_train))
    np.testing.assert_array_equal(test, np.sort(ref_test))


def test_ties_in_the_class_counts_are_drawn_as_scikit_learn_draws_them():
  labels = np.repeat(np.arange(7), [5, 5, 5, 4, 4, 3, 3])  # equal remainders: rng.choice decides
  for seed in range(40):
    train, test = digits.stratified_split(labels, 9, seed)
    ref = model_selection.train_test_split(
      np.arange(len(labels)), test_size=9, stratify=labels, random_state=seed
    )
    np.testing.assert_array_equal(test, np.sort(ref[1]))
    np.testing.assert_array_equal(train, np.sort(ref[0]))


def test_loading_the_digits_imports_no_scikit_learn():
  code = (
    'import sys; from configs import digits as c; from input_pipeline import digits\n'
    "d = digits.load(c.get_config('smoke'))\n"
    "print(len(d.train.labels), len(d.test.labels), 'sklearn' in sys.modules)"
  )
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ['1437', '360', 'False']
