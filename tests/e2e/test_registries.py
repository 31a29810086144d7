"""The two registries of issue 41: a model is one module found by config.model.name (ResNet-50
beside ResNet-18; a researcher's module outside the project), a number format one table entry
(numerics/formats.py FORMATS): each trained end to end with nothing else edited."""

import signal
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common, validation
from numerics import formats, ops
from runrecord import record
from tests.conftest import ROOT, cpu_xla_flags
from tests.support.faults_common import (
  TRAIN,
  last_line,
  metric_records,
  run_train,
  without_wall_time,
)
from trainer import checkpoint, run, train

# One device, one phase, one epoch (22 steps), checkpoints only where a run stops or ends: one
# training step compiled, shared by the three runs through the persistent compilation cache.
RESNET50 = 'configs/digits.py:smoke,model.name=resnet50,num_epochs=1,optim.freeze_epochs=0'


@pytest.mark.timeout(600)
def test_resnet50_trains_checkpoints_and_resumes_bit_identically(tmp_path, subprocess_env):
  """`python train.py --config=configs/digits.py:smoke,model.name=resnet50,... --workdir=W`: stopped
  by SIGTERM during step 7, the same command again resumes and ends bit-identical to a run that was
  never stopped (results record and metrics.jsonl)."""
  env = {**subprocess_env, 'XLA_FLAGS': cpu_xla_flags(1)}
  ref_dir, workdir = tmp_path / 'reference', tmp_path / 'w'
  args = [f'--config={RESNET50}', '--config.checkpoint_every_steps=0']
  proc = run_train(args + [f'--workdir={ref_dir}'], env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  ref = record.read_results(str(ref_dir))
  assert ref['status'] == 'completed' and ref['config']['model']['name'] == 'resnet50'
  assert ref['platform'] == 'cpu' and ref['num_devices'] == 1 and ref['step'] == 22
  args.append(f'--workdir={workdir}')
  proc = run_train(args, env, fault='term@step:7', timeout=300)
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  assert last_line(proc.stderr)[0].startswith('stopped: SIGTERM received: stopped after step 7')
  assert record.read_results(str(workdir))['step'] == 7
  proc = run_train(args, env, timeout=300)
  assert proc.returncode == 0 and 'at step 7' in proc.stderr, proc.stderr[-3000:]
  assert without_wall_time(record.read_results(str(workdir))) == without_wall_time(ref)
  assert metric_records(workdir) == metric_records(ref_dir)


TINY = '''"""A researcher's model: one convolution, BatchNorm, global average pool, a head."""
import jax
import jax.numpy as jnp
from flax import nnx

from models import layers

PARTS = {'stem': ('conv', 'bn'), 'head': ('fc',)}
WIDTH = 16


class Tiny(nnx.Module):
  def __init__(self, num_classes, in_channels, fmt, rngs):
    self.conv = layers.Conv2d(in_channels, WIDTH, 3, padding=1, fmt=fmt, rngs=rngs)
    self.bn = layers.BatchNorm(WIDTH)
    self.fc = layers.Linear(WIDTH, num_classes, rngs=rngs)

  def __call__(self, x):
    x = jax.nn.relu(self.bn(self.conv(x)))
    return self.fc(jnp.mean(x, axis=(1, 2))).astype(jnp.float32)


def create(config, num_classes, in_channels, rngs):
  return Tiny(num_classes, in_channels, config.numerics.conv_format, rngs)


def activation_values(config):
  size = config.data.image_size
  return size * size * WIDTH, size * size * (WIDTH + 1)
'''


def test_a_model_module_outside_the_project_trains_from_the_command_line(tmp_path, subprocess_env):
  """tmp_path/my_models/tiny.py on PYTHONPATH, named by model.name=my_models.tiny: resolved,
  checked against its contract, trained, evaluated and recorded, no file of the project edited.
  Its products go through the numerics (a noisy conv format needs and gets its step keys)."""
  (tmp_path / 'my_models').mkdir()
  (tmp_path / 'my_models' / 'tiny.py').write_text(TINY)
  env = {**subprocess_env, 'PYTHONPATH': f'{ROOT}:{tmp_path}'}
  workdir = tmp_path / 'w'
  config = '--config=configs/digits.py:smoke,model.name=my_models.tiny,num_epochs=4'
  args = [config, '--config.numerics.conv_format=bf16_noise', f'--workdir={workdir}']
  proc = subprocess.run(TRAIN + args, cwd=ROOT, env=env, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = record.read_results(str(workdir))
  assert results['status'] == 'completed' and results['config']['model']['name'] == 'my_models.tiny'
  assert results['numerics']['effective']['conv_format'] == 'bf16_noise'
  assert results['final']['test_accuracy'] > 0.2  # ten digits: chance is 0.1
  missing = subprocess.run(  # the same command without the module's folder: one line, exit 2
    TRAIN + args[:1] + [f'--workdir={tmp_path / "w2"}'],
    cwd=ROOT,
    env=subprocess_env,
    capture_output=True,
    text=True,
  )
  assert missing.returncode == 2 and missing.stderr == (
    "error: config.model.name='my_models.tiny': no model module my_models.tiny: name a module in "
    'models/ (resnet18, resnet50) or a dotted module on PYTHONPATH (my_models.tiny)\n'
  )


def fp16_operands(a, key):
  """IEEE half precision: 10 mantissa bits like TF32, but 5 exponent bits (max 65504)."""
  del key
  return [a.astype(jnp.float16).astype(jnp.float32)]


def test_a_number_format_is_one_table_entry(monkeypatch, tmp_path):
  """'fp16' planted in numerics/formats.py FORMATS in this process: accepted by the config
  checks, trained with (every convolution's operands rounded to half precision, forward and
  backward), recorded, and its products differ from bf16's and f32's on the trained model."""
  entry = formats.Format('operands rounded to IEEE fp16, one pass', fp16_operands, formats.ONE_PASS)
  monkeypatch.setitem(formats.FORMATS, 'fp16', entry)

  def config(fmt):
    return validation.resolve(
      common.load('configs/digits.py:smoke', [('numerics.conv_format', fmt)])
    )

  results = train.train_and_evaluate(config('fp16'), str(tmp_path / 'fp16'))
  assert results['status'] == 'completed' and results['config']['numerics']['conv_format'] == 'fp16'
  effective = results['numerics']['effective']
  assert effective['conv_format'] == 'fp16' and effective['emulate_impl']['conv'] == 'reference'
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 6, 3)), jnp.float32)
  k = jnp.asarray(np.random.default_rng(1).normal(size=(3, 3, 3, 4)), jnp.float32)
  rounded = [a.astype(jnp.float16).astype(jnp.float32) for a in (x, k)]
  product = ops.conv2d(*rounded, 1, 'SAME', impl='xla', fmt='f32')
  assert np.array_equal(ops.conv2d(x, k, 1, 'SAME', impl='xla', fmt='fp16'), product)
  ctx = run.build(config('fp16'))
  mngr = checkpoint.manager(str(tmp_path / 'fp16'), 3)
  state, _ = checkpoint.restore(mngr, mngr.latest_step(), train.abstract_state(ctx))
  checkpoint.close(mngr)
  images = ctx.dataset.test.images[:64]

  def logits(fmt):
    other = run.build(config(fmt), ctx.dataset)
    fn = jax.jit(lambda s: train.eval_logits(other.graphdef, s, 0, images, other.mean, other.std))
    return np.asarray(fn(state), np.float64)

  fp16, bf16, f32 = logits('fp16'), logits('bf16'), logits('f32')
  assert not np.array_equal(fp16, bf16) and not np.array_equal(fp16, f32)
  assert np.max(np.abs(fp16 - f32)) < np.max(np.abs(bf16 - f32))  # 10 mantissa bits, not 7
