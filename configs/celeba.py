"""CelebA identity classification as in the reference study: the TPU-vs-GPU ResNet-18 experiment
published in AI-Hypercomputer/torchprime (GitHub, `torchprime/models/resnet18/`, July 2025)."""

from configs import common


def base():
  c = common.base_config()
  c.data.name = 'celeba'
  c.data.task = 'identity'
  return c


def tpu(c):
  """A TPU's native numerics: f32 storage, one-pass bf16 products (the platform default)."""
  c.numerics.matmul_precision = 'default'


def gpu(c):
  """A GPU's native numerics (TF32 products under 'default'), deterministic kernels."""
  c.numerics.matmul_precision = 'default'
  c.numerics.gpu_deterministic = True


def cpu(c):
  """A CPU-sized version of the study: small images and width, a few epochs."""
  c.data.image_size = 64
  c.model.width = 0.25
  c.batch_size = 256
  c.eval_batch_size = 512
  c.num_epochs = 4
  c.optim.freeze_epochs = 1


def smoke(c):
  """Seconds on CPU, on a generated CelebA-format fixture (see input_pipeline)."""
  c.data.image_size = 16
  c.model.width = 0.125
  c.model.stem = 'small'
  c.batch_size = 32
  c.eval_batch_size = 64
  c.num_epochs = 2
  c.log_every_steps = 2
  c.optim.freeze_epochs = 1
  c.optim.warmup_epochs = 0.5


PRESETS = {'__base__': base, 'tpu': tpu, 'gpu': gpu, 'cpu': cpu, 'smoke': smoke}

# The factorial numerics study (get_sweep, get_study). Profiles: numerics/formats.py PROFILES.
# `native` is each platform's own arithmetic; the others reproduce one platform's on every platform.
PROFILES = ('native', 'tpu_default', 'jax_gpu_default', 'torch_gpu_default', 'f32')
NOISE_PROFILE = 'bf16_noise'  # the noise control: its replicate spread is the noise floor
DTYPES = ('float32', 'bfloat16')  # activations
TPU_CORES = 8  # per-core BatchNorm: each of 8 cores normalises over 1/8 of the global batch
# Pre-registered before any CelebA run of this design (the power calculation behind SEEDS).
MARGIN_PP = 1.0
MARGIN_REASON = (
  'about the seed sd of the published runs (0.65 pp GPU, 0.90 pp TPU): a platform '
  'or format effect smaller than the spread of retraining on one platform cannot '
  'change which model one would deploy'
)
SEED_SD_PP = 0.90
SEED_SD_SOURCE = (
  'sd of top-1 test accuracy over the 14 published TPU runs of this setup '
  '(AI-Hypercomputer/torchprime ResNet-18 on CelebA: TPU 0.90 pp, GPU 0.65 pp); '
  'the larger of the two'
)
PAIRED_SD_PP = 1.27
PAIRED_SD_SOURCE = (
  'sqrt(2) x SEED_SD_PP: arms sharing a seed assumed uncorrelated (no credit '
  'for pairing), as in the digits pilot, where the per-seed differences between '
  'arms had sd 1.1-1.4 pp at arm sds of 0.4-1.3 pp'
)
# statsmodels power (analysis/stats.py seeds_needed, paired, alpha 0.05, 80% power) at
# PAIRED_SD_PP and MARGIN_PP: 15 seeds to detect the margin, 16 to show equivalence within it
# (tests/e2e/test_sweep.py checks it); main effects pool 4 or more arms per level.
SEEDS = 16


def get_config(arg=None):
  return common.build(arg, PRESETS)


def study_arms(batch_size):
  """The arms (overrides without seed): PROFILES x BatchNorm grouping x DTYPES, and the noise arm"""
  groups = (0, max(1, batch_size // TPU_CORES))
  arms = [
    {'numerics.profile': p, 'numerics.batchnorm_group': g, 'numerics.compute_dtype': d}
    for p in PROFILES
    for g in groups
    for d in DTYPES
  ]
  return arms + [{**arms[0], 'numerics.profile': NOISE_PROFILE}]  # arms[0]: the reference levels


def get_sweep(arg=None):
  """The factorial study: 21 arms x SEEDS seeds, run on each platform (README, "Which setting")."""
  arms = study_arms(get_config(arg).batch_size)
  return [{**arm, 'seed': seed} for arm in arms for seed in range(SEEDS)]


# Short arm labels (analysis/declaration.py): an arm is named by what differs from the reference.
LABELS = {
  'profile': '{}',
  'batchnorm_group': 'BN/{}',
  'compute_dtype': {'bfloat16': 'bf16 activations', 'float32': 'f32 activations'},
}


# "Explained by numerics" needs the numerics part to be at least this share of the platform gap
# by the share's lower 95% bound (analysis/attribution.py).
MIN_SHARE = 0.5
MIN_SHARE_REASON = (
  'the numerics must be the larger part of the gap at 95% confidence for the '
  'gap to count as explained by them'
)


def get_study(arg=None):
  """The declaration the sweep writes and the analysis reads (docs/statistics.md)."""
  del arg
  return {
    'margin': MARGIN_PP,
    'margin_reason': MARGIN_REASON,
    'factors': ['platform', 'profile', 'batchnorm_group', 'compute_dtype'],
    'reference': {'profile': 'native', 'batchnorm_group': '0', 'compute_dtype': 'float32'},
    'noise_arm': {'profile': NOISE_PROFILE},
    'noise_of': {'profile': 'f32', 'batchnorm_group': '0', 'compute_dtype': 'float32'},
    'min_share': MIN_SHARE,
    'min_share_reason': MIN_SHARE_REASON,
    'native': {'profile': 'native'},
    'platform_profile': {'tpu': 'tpu_default', 'gpu': 'jax_gpu_default', 'cpu': 'f32'},
    'labels': LABELS,
    'seed_sd': SEED_SD_PP,
    'seed_sd_source': SEED_SD_SOURCE,
    'paired_sd': PAIRED_SD_PP,
    'paired_sd_source': PAIRED_SD_SOURCE,
    'seeds': SEEDS,
  }
