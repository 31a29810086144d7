"""CelebA identity classification as in the reference study (REFERENCE.md section 1).

  python train.py --config=configs/celeba.py:tpu --config.data.manual_dir=DIR --workdir=W

Defaults: 224x224, batch 2048, AdamW lr 0.01 / wd 0.001, 1 warmup epoch, 25 epochs of which the
first 5 train the stem and head only, then a fresh optimizer and schedule (`optim.schedule`).
"""

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

SWEEP_SEEDS = range(10)
TPU_CORES = 8  # per-core BatchNorm arm: each of 8 cores normalises over 1/8 of the global batch


def get_config(arg=None):
  return common.build(arg, PRESETS)


def get_sweep(arg=None):
  """The standard numerics arms x 10 seeds (`python -m analysis.sweep --config=configs/celeba.py:gpu`).

  emulate=bf16: a TPU's default one-pass bf16 products; emulate=tf32: a GPU's default TF32
  products; emulate=f32: true f32 products; compute_dtype=bfloat16: bf16 activations; and the TPU
  arm again with BatchNorm statistics per group of batch_size/8 examples, as on 8 TPU cores. Every
  arm runs on any backend: run the sweep once per platform (its own --root, or one root) and
  analysis.stats groups the runs by platform and device kind as well.
  """
  per_core = max(1, get_config(arg).batch_size // TPU_CORES)
  arms = ({'numerics.emulate': 'bf16'}, {'numerics.emulate': 'tf32'}, {'numerics.emulate': 'f32'},
          {'numerics.compute_dtype': 'bfloat16'},
          {'numerics.emulate': 'bf16', 'numerics.batchnorm_group': per_core})
  return [{**arm, 'seed': seed} for arm in arms for seed in SWEEP_SEEDS]
