"""The CelebA tests' data (tests/e2e/test_celeba*.py): a generated CelebA-format fixture and the
dataset loaded from it, once per session (pytest fixtures, registered by tests/conftest.py
pytest_plugins); the smoke config that reads a folder, its metadata and split, a copy to edit."""

import shutil

import pytest

from configs import celeba as celeba_config
from input_pipeline import celeba, celeba_fixture


def smoke_config(manual_dir, **data):
  """configs/celeba.py's smoke preset reading `manual_dir`, with data fields set from `data`."""
  config = celeba_config.get_config('smoke')
  config.data.manual_dir = manual_dir
  for key, value in data.items():
    config.data[key] = value
  return config


@pytest.fixture(scope='session')
def fixture_dir(tmp_path_factory):
  """(folder, owners) of a generated CelebA-format fixture: 16 identities, up to 9 images each."""
  out = str(tmp_path_factory.mktemp('celeba') / 'files')
  owners = celeba_fixture.generate(out, identities=16, max_images=9, seed=3)
  return out, owners


@pytest.fixture(scope='session')
def dataset(fixture_dir):
  """celeba.load of `fixture_dir` with the smoke preset."""
  return celeba.load(smoke_config(fixture_dir[0]))


def meta_and_split(manual_dir, **data):
  """(metadata, split) of the files in `manual_dir` under the smoke preset with `data` set."""
  config = smoke_config(manual_dir, **data)
  meta = celeba.read_metadata(manual_dir)
  return meta, celeba._split(config.data, meta)


def copy_fixture(fixture_dir, tmp_path):
  """A copy of the fixture's files (without its prepared TFDS folder) to edit: its path."""
  target = tmp_path / 'copy'
  shutil.copytree(fixture_dir[0], target, ignore=shutil.ignore_patterns('tfds'))
  return target
