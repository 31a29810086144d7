"""Input pipelines: `get_dataset(config)` returns a `base.Dataset` for `config.data.name`."""

from input_pipeline import base


def get_dataset(config):
  name = config.data.name
  if name == 'digits':
    from input_pipeline import digits
    return digits.load(config)
  if name == 'celeba':
    from input_pipeline import celeba  # imports TensorFlow(-datasets) only when asked for
    return celeba.load(config)
  raise ValueError(f"config.data.name must be 'digits' or 'celeba', got {name!r}")


DATASETS = ('digits', 'celeba')
