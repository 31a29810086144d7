"""The embedded default: scikit-learn's digits (no download)."""

from configs import celeba, common


def base():
  c = common.base_config()
  c.data.name = 'digits'
  c.data.image_size = 32
  c.data.split_seed = 0
  c.model.stem = 'small'
  c.num_epochs = 30
  c.batch_size = 128
  c.eval_batch_size = 512
  c.log_every_steps = 10
  c.optim.learning_rate = 0.003
  c.optim.weight_decay = 0.0005
  c.optim.warmup_epochs = 2.0
  c.optim.freeze_epochs = 0  # trained from scratch: a frozen random backbone would make no sense
  return c


def tpu(c):
  c.model.width = 1.0


def gpu(c):
  c.model.width = 1.0
  c.numerics.gpu_deterministic = True


def cpu(c):
  """About two minutes on a 2-core machine; reaches >= 90% test accuracy."""
  c.model.width = 0.25
  c.data.image_size = 16


def smoke(c):
  """Seconds: exercises every phase (frozen, unfrozen, eval, checkpoint), learns little."""
  c.model.width = 0.125
  c.data.image_size = 8
  c.num_epochs = 2
  c.batch_size = 64
  c.eval_batch_size = 256
  c.log_every_steps = 5
  c.optim.freeze_epochs = 1
  c.optim.warmup_epochs = 0.5


def study(c):
  """The README's factorial study (8 arms x SEEDS seeds) in minutes on 2 cores: ~95% accuracy."""
  cpu(c)
  c.data.image_size = 8  # the digits' native 8x8: no resize, a quarter of the cpu preset's compute
  c.num_epochs = 4
  c.optim.warmup_epochs = 1.0


def variance(c):
  """Where a run's spread comes from: INIT_SEEDS x DATA_SEEDS x REPLICATES runs of one arm."""
  study(c)
  c.numerics.profile = 'native'  # the study's reference arm (global BatchNorm, f32 activations)


PRESETS = {
  '__base__': base,
  'tpu': tpu,
  'gpu': gpu,
  'cpu': cpu,
  'smoke': smoke,
  'study': study,
  'variance': variance,
}

# `make study`: a one-factor-at-a-time fraction of configs/celeba.py's factorial (docs/configs.md).
# Declared before the study ran (the power calculation behind SEEDS):
MARGIN_PP = 2.0
MARGIN_REASON = (
  'a pipeline demonstration, not a claim: 7 of the 360 test images; a tighter '
  'margin needs more seeds than a 2-core CPU runs in minutes'
)
SEED_SD_PP = 1.0
PAIRED_SD_PP = 1.3
SD_SOURCE = (
  'pilot of this preset on CPU (3 emulated arms f32/bf16/tf32 x 5 seeds): arm sds '
  '0.4-1.3 pp, sd of the per-seed differences between arms 1.1-1.4 pp'
)
# statsmodels power (analysis/stats.py seeds_needed) at PAIRED_SD_PP and MARGIN_PP: 6 seeds both
# to detect the margin and to show equivalence within it (tests/e2e/test_sweep.py checks it).
SEEDS = 6
# The variance preset's crossed design: every init seed with every data seed, each run REPLICATES
# times (a run's `seed` numbers its (init, data) cell, so its replicates share it).
INIT_SEEDS, DATA_SEEDS, REPLICATES = 3, 3, 2


def get_config(arg=None):
  return common.build(arg, PRESETS)


def study_arms(batch_size):
  """The fraction's 8 arms (override dicts without seed), reference arm first."""
  reference = {
    'numerics.profile': 'native',
    'numerics.batchnorm_group': 0,
    'numerics.compute_dtype': celeba.DTYPES[0],
  }
  arms = [{**reference, 'numerics.profile': p} for p in celeba.PROFILES]
  arms.append({**reference, 'numerics.batchnorm_group': max(1, batch_size // celeba.TPU_CORES)})
  arms.append({**reference, 'numerics.compute_dtype': celeba.DTYPES[1]})
  return arms + [{**reference, 'numerics.profile': celeba.NOISE_PROFILE}]


def variance_runs():
  """The variance preset's runs: init seeds x data seeds x replicates on one arm."""
  return [
    {'init_seed': i, 'data_seed': d, 'replicate': r, 'seed': i * DATA_SEEDS + d}
    for i in range(INIT_SEEDS)
    for d in range(DATA_SEEDS)
    for r in range(REPLICATES)
  ]


def get_sweep(arg=None):
  """The study of `python -m sweeps.run_study`: arms x seeds, or with `variance`, variance_runs."""
  config = get_config(arg)
  if 'variance' in config.preset.split(','):
    return variance_runs()
  arms = study_arms(config.batch_size)
  return [{**arm, 'seed': seed} for arm in arms for seed in range(SEEDS)]


def get_study(arg=None):
  """configs/celeba.py's declaration with this study's margin and power inputs."""
  return {
    **celeba.get_study(arg),
    'margin': MARGIN_PP,
    'margin_reason': MARGIN_REASON,
    'seed_sd': SEED_SD_PP,
    'seed_sd_source': SD_SOURCE,
    'paired_sd': PAIRED_SD_PP,
    'paired_sd_source': SD_SOURCE,
    'seeds': SEEDS,
  }
