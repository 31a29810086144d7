"""The embedded default: scikit-learn's digits (no download).

  python train.py --config=configs/digits.py:cpu --workdir=/tmp/digits
"""

from configs import common


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
  """The README's study (get_sweep: 3 arms x 5 seeds) in minutes on 2 cores: ~95% test accuracy."""
  cpu(c)
  c.data.image_size = 8  # the digits' native 8x8: no resize, a quarter of the cpu preset's compute
  c.num_epochs = 4
  c.optim.warmup_epochs = 1.0


PRESETS = {'__base__': base, 'tpu': tpu, 'gpu': gpu, 'cpu': cpu, 'smoke': smoke, 'study': study}

# The numerics arms of `get_sweep`: the product formats of a TPU (one-pass bf16), of a GPU (TF32)
# and true f32, each emulated bit-exactly so that all three run on any backend (numerics/emulate.py).
SWEEP_ARMS = ({'numerics.emulate': 'f32'}, {'numerics.emulate': 'bf16'},
              {'numerics.emulate': 'tf32'})
SWEEP_SEEDS = range(5)


def get_config(arg=None):
  return common.build(arg, PRESETS)


def get_sweep(arg=None):
  """The study run by `python -m analysis.sweep --config=configs/digits.py:study`: arms x seeds."""
  del arg  # the same arms and seeds under every preset
  return [{**arm, 'seed': seed} for arm in SWEEP_ARMS for seed in SWEEP_SEEDS]
