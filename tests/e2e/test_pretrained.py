"""models/pretrained.py: torchvision ResNet-18 and ResNet-50 files load with logits parity against
PyTorch.

Run from the repository root: JAX_PLATFORMS=cpu python -m pytest tests/e2e/test_pretrained.py
"""

import os
import pickle
import subprocess
import sys
import zipfile

import jax
import numpy as np
import pytest
from flax import nnx

from benchmarks.bench_vs_torch import torch_resnet18, torch_resnet50
from configs import digits, validation
from models import layers, pretrained, resnet
from tests.conftest import ROOT

torch = pytest.importorskip(
  'torch', reason='torch (test-only extra) is not installed: the PyTorch parity tests need it'
)
nn = torch.nn

# max |jax - torch| / max |torch|. Not bit-exact: PyTorch's CPU kernels (oneDNN) and XLA order each
# convolution's f32 sums differently (n up to 3*3*512 = 4608 terms). The worst case, 2 n u per
# layer (u = 2^-24: 5.5e-4), compounded over 20 layers, guarantees nothing useful; rounding errors
# grow as sqrt(n) u in practice (~8e-6 per layer at n = 4608). Measured on an x86-64 CPU with
# torch 2.13: eval logits 7.9e-7 (per-image part 7.4e-6), train-mode logits 3.3e-6, running
# statistics 8.2e-7. RTOL = 1e-4 is 14x the largest of them (kept).
RTOL = 1e-4
FORMATS = ('.pth', '.safetensors', '.npz')


def random_torch_resnet(seed=0, layers=(2, 2, 2, 2), num_classes=1000, bottleneck=False):
  """Random weights and random BN affine parameters and running statistics (`bottleneck`: the
  ResNet-50)."""
  torch.manual_seed(seed)
  net = torch_resnet50(num_classes) if bottleneck else torch_resnet18(num_classes, blocks=layers)
  with torch.no_grad():
    for m in net.modules():
      if isinstance(m, nn.BatchNorm2d):
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_(0.0, 0.1)
        m.running_mean.normal_(0.0, 0.1)
        m.running_var.uniform_(0.5, 1.5)
        m.num_batches_tracked.fill_(7)
  return net


def save(state, path):
  """Write a torch state dict as .pth, .safetensors or .npz."""
  path = str(path)
  if path.endswith('.pth'):
    torch.save(state, path)
    return path
  arrays = {k: v.detach().numpy().copy() for k, v in state.items()}
  if path.endswith('.safetensors'):
    from safetensors.numpy import save_file

    save_file(arrays, path)
  else:
    np.savez(path, **arrays)
  return path


def rel_err(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.fixture(scope='module')
def net():
  return random_torch_resnet()


@pytest.fixture(scope='module')
def files(net, tmp_path_factory):
  folder = tmp_path_factory.mktemp('weights')
  return {ext: save(net.state_dict(), folder / f'resnet18{ext}') for ext in FORMATS}


@pytest.fixture(scope='module')
def images():
  return np.random.default_rng(0).normal(size=(4, 64, 64, 3)).astype(np.float32)  # NHWC


def abstract_resnet(*args, **kwargs):
  """A shape-only ResNet18 (no weights computed): enough for checks that fail before copying."""
  return nnx.eval_shape(lambda: resnet.ResNet18(*args, **kwargs, rngs=nnx.Rngs(0)))


def torch_logits(net, x, train):
  net.train(train)
  with torch.no_grad():
    return net(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()


@pytest.mark.parametrize('ext', FORMATS)
def test_eval_logits_match_pytorch(net, files, images, ext):
  want = torch_logits(net, images, train=False)
  model = pretrained.load_torchvision(files[ext])
  with jax.default_matmul_precision('highest'):
    got = model(images)
  err = rel_err(got, want)
  # Random deep nets give similar logits for every image: check the per-image part separately.
  centred = rel_err(got - np.mean(got, 0), want - np.mean(want, 0))
  print(f'eval {ext}: max rel err {err:.2e}, centred {centred:.2e}')
  assert err <= RTOL and centred <= RTOL, (err, centred)


def test_resnet50_logits_match_pytorch_in_eval_and_train_mode(tmp_path, images):
  """torchvision's resnet50 layout (benchmarks/bench_vs_torch.py) with random weights, BN affine
  parameters and running statistics, saved as a torchvision-keyed state dict: the file says which
  ResNet it holds, the registry's resnet50 loads it, and its logits (eval and train mode) and
  updated running statistics are PyTorch's within RTOL."""
  net = random_torch_resnet(seed=1, bottleneck=True)
  path = save(net.state_dict(), tmp_path / 'resnet50.pth')
  model = pretrained.load_torchvision(path)
  assert isinstance(model, resnet.ResNet50) and layers.count_params(model) == 25_557_032
  for train in (False, True):
    want = torch_logits(net, images, train=train)
    model.train() if train else model.eval()
    with jax.default_matmul_precision('highest'):
      got = model(images)
    err = rel_err(got, want)
    centred = rel_err(got - np.mean(got, 0), want - np.mean(want, 0))
    print(f'resnet50 train={train}: max rel err {err:.2e}, centred {centred:.2e}')
    # Measured (x86-64, torch 2.13): eval 1.1e-6 (centred 1.7e-5), train 3.8e-5. In train mode
    # the batch statistics of 4 images leave logits that hardly differ between the images, so
    # their centred part (9e-5 there) is no scale to hold the error to: eval only.
    assert err <= RTOL and (train or centred <= RTOL), (train, err, centred)
  state = net.state_dict()
  stats = [k for k in layers.torch_keys(model) if 'running_' in k]
  assert len(stats) == 106
  for key in stats:
    variable, to_nnx = layers.torch_keys(model)[key]
    assert rel_err(variable[...], to_nnx(state[key].numpy())) <= RTOL, key
  assert (
    rel_err(
      model.layer4[2].bn3.var[...],
      random_torch_resnet(1, bottleneck=True).state_dict()['layer4.2.bn3.running_var'].numpy(),
    )
    > 1e-3
  )  # the statistics moved


def test_train_mode_logits_and_running_stats_match_pytorch(files, images):
  net = random_torch_resnet()  # a fresh copy: a train-mode forward updates running stats
  want = torch_logits(net, images, train=True)
  model = pretrained.load_torchvision(files['.npz'])
  model.train()
  with jax.default_matmul_precision('highest'):
    got = model(images)
  err = rel_err(got, want)
  centred = rel_err(got - np.mean(got, 0), want - np.mean(want, 0))
  print(f'train logits: max rel err {err:.2e}, centred {centred:.2e}')
  assert err <= RTOL and centred <= RTOL, (err, centred)
  state = net.state_dict()
  worst = 0.0
  for key, (variable, to_nnx) in layers.torch_keys(model).items():
    if 'running_' in key:
      stat_err = rel_err(variable[...], to_nnx(state[key].numpy()))
      worst = max(worst, stat_err)
      assert stat_err <= RTOL, (key, stat_err)
  print(f'train running stats: max rel err {worst:.2e}')
  # The statistics really moved (else the check above could not fail).
  before = random_torch_resnet().state_dict()['layer4.1.bn2.running_var'].numpy()
  assert rel_err(model.layer4[1].bn2.var[...], before) > 1e-3


def test_new_num_classes_reinitialises_only_head(net, files):
  model = pretrained.load_torchvision(files['.safetensors'], num_classes=10)
  assert model.fc.kernel[...].shape == (512, 10)
  want = net.state_dict()['layer3.0.conv1.weight'].numpy().transpose(2, 3, 1, 0)
  np.testing.assert_array_equal(model.layer3[0].conv1.kernel[...], want)


def test_load_into_reinit_keeps_backbone_exact_and_stem_head_fresh(net, files):
  model = resnet.ResNet18(1000, rngs=nnx.Rngs(1))
  facts = pretrained.load_into(model, files['.npz'], ('stem', 'head'))
  assert facts['reinit'] == ['stem', 'head'] and len(facts['sha256']) == 16
  # 122 torchvision keys less 20 num_batches_tracked; stem: conv1 + 4 of bn1; head: 2.
  assert facts['keys_in_file'] == 102 and facts['keys_loaded'] == 102 - 5 - 2
  state = {k: v.numpy() for k, v in net.state_dict().items()}
  for key, (variable, to_nnx) in layers.torch_keys(model).items():
    value, file_value = np.asarray(variable[...]), to_nnx(state[key])
    if key.split('.')[0] in ('conv1', 'bn1', 'fc'):
      assert not np.array_equal(value, file_value), key
    else:
      np.testing.assert_array_equal(value, file_value, err_msg=key)


def test_load_into_digits_like_model(files):
  """1-channel input, small stem, 10 classes: fine when stem and head are re-initialised."""
  model = resnet.ResNet18(10, in_channels=1, stem='small', rngs=nnx.Rngs(0))
  pretrained.load_into(model, files['.npz'], ('stem', 'head'))
  want = np.load(files['.npz'])['layer4.1.bn2.running_var']
  np.testing.assert_array_equal(model.layer4[1].bn2.var[...], want)
  with pytest.raises(ValueError, match=r'shape mismatch: conv1\.weight.*fc\.weight'):
    pretrained.load_into(abstract_resnet(10, in_channels=1, stem='small'), files['.npz'], ())


def test_missing_and_unexpected_keys_are_named(net, tmp_path):
  state = dict(net.state_dict())
  del state['layer2.1.bn1.running_var']
  state['extra.weight'] = torch.zeros(3)
  path = save(state, tmp_path / 'bad.npz')
  with pytest.raises(
    ValueError,
    match=r'missing: layer2\.1\.bn1\.running_var; '
    r'unexpected: extra\.weight',
  ):
    pretrained.load_into(abstract_resnet(), path)


def test_shape_mismatch_is_named(net, tmp_path):
  state = dict(net.state_dict())
  state['layer3.0.conv2.weight'] = torch.zeros(256, 256, 1, 1)
  path = save(state, tmp_path / 'bad.safetensors')
  with pytest.raises(
    ValueError,
    match=r'layer3\.0\.conv2\.weight file \(256, 256, 1, 1\) != '
    r'model \(256, 256, 3, 3\)',
  ):
    pretrained.load_torchvision(path)


def test_wrong_architecture(tmp_path):
  path = save(random_torch_resnet(layers=(3, 4, 6, 3)).state_dict(), tmp_path / 'r34.npz')
  with pytest.raises(ValueError, match='holds ResNet-34'):
    pretrained.load_torchvision(path)
  r50 = {
    f'layer{s}.{b}.{n}.weight': np.zeros(1, np.float32)
    for s, blocks in zip((1, 2, 3, 4), (3, 4, 6, 3), strict=True)
    for b in range(blocks)
    for n in ('conv1', 'conv2', 'conv3')
  }
  np.savez(tmp_path / 'r50.npz', **r50)
  with pytest.raises(ValueError, match='holds ResNet-50'):
    pretrained.load_into(abstract_resnet(), str(tmp_path / 'r50.npz'))
  save(random_torch_resnet().state_dict(), tmp_path / 'r18.npz')
  with pytest.raises(ValueError, match="holds ResNet-18 .* config.model.name='resnet50' builds"):
    pretrained.load_into(abstract_resnet(), str(tmp_path / 'r18.npz'), (), 'resnet50')


def test_missing_file_width_reinit_and_format_errors(files, tmp_path):
  with pytest.raises(FileNotFoundError, match='config.model.init_from: no file at'):
    pretrained.load_torchvision(str(tmp_path / 'nope.pth'))
  config = digits.get_config('smoke')  # pretrained weights are full width: refused at resolution
  config.model.init_from = files['.npz']
  with pytest.raises(validation.ConfigError, match='config.model.width must be 1.0'):
    validation.resolve(config)
  with pytest.raises(ValueError, match='config.model.reinit: unknown part'):
    pretrained.load_into(abstract_resnet(), files['.npz'], ('stem', 'fc'))
  (tmp_path / 'w.bin').write_bytes(b'0')
  with pytest.raises(ValueError, match='unsupported file type'):
    pretrained.read_state_dict(str(tmp_path / 'w.bin'))
  with pytest.raises(ValueError, match='in_channels must be 3'):
    pretrained.load_torchvision(files['.npz'], in_channels=1)


class RunsCode:
  """Unpickling it runs code: touches the file named by its argument."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f'touch {self.marker}',))


def hostile_files(folder):
  """{name: (path, what its error says)}: damaged and hostile files of each format."""
  marker = folder / 'EXECUTED'
  with open(folder / 'runs_code.pth', 'wb') as f:
    pickle.dump({'conv1.weight': RunsCode(marker)}, f)
  (folder / 'garbage.pth').write_bytes(b'not a pickle' * 10)
  (folder / 'garbage.safetensors').write_bytes(b'\x10' + bytes(7) + b'{"a": garbage}  ')
  (folder / 'garbage.npz').write_bytes(b'PK\x03\x04garbage')
  np.save(folder / 'obj.npy', np.array([RunsCode(marker)], dtype=object), allow_pickle=True)
  with zipfile.ZipFile(folder / 'pickled.npz', 'w') as archive:
    archive.write(folder / 'obj.npy', 'conv1.weight.npy')
  refused = 'refused it: it holds more than tensors and plain containers'
  return {
    'runs_code.pth': refused,
    'garbage.pth': refused,
    'garbage.safetensors': 'SafetensorError: Error while deserializing header',
    'garbage.npz': 'BadZipFile: File is not a zip file',
    'pickled.npz': 'Object arrays cannot be loaded when allow_pickle=False',
  }, marker


def test_damaged_or_hostile_files_are_one_line_naming_field_file_and_fix(tmp_path, subprocess_env):
  """Before: a 38-line traceback from train.py (.pth, .safetensors), or a line naming neither the
  field nor the file (.npz)."""
  cases, marker = hostile_files(tmp_path)
  for name, detail in cases.items():
    path = str(tmp_path / name)
    with pytest.raises(ValueError) as e:
      pretrained.read_state_dict(path)
    ext = os.path.splitext(name)[1]
    assert str(e.value).startswith(
      f'config.model.init_from: {path!r} is not a readable {ext} state dict ('
    ) and detail in str(e.value)
    assert str(e.value).endswith(f'written with {pretrained.HOW_TO_SAVE[ext]}')
    assert '\n' not in str(e.value)
  proc = subprocess.run(
    [
      sys.executable,
      'train.py',
      '--config=configs/digits.py:smoke',
      f'--config.model.init_from={tmp_path}/runs_code.pth',
      '--config.model.width=1.0',  # pretrained weights are full width
      f'--workdir={tmp_path}/w',
    ],
    cwd=ROOT,
    env=subprocess_env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr[-3000:]
  assert proc.stderr.startswith(
    f"error: config.model.init_from: '{tmp_path}/runs_code.pth' is not a readable .pth state dict"
  )
  assert not marker.exists()


def test_pth_without_torch_says_how_to_convert(files, monkeypatch):
  monkeypatch.setitem(sys.modules, 'torch', None)  # import torch fails, as on a TPU VM
  with pytest.raises(ValueError) as e:
    pretrained.read_state_dict(files['.pth'])
  assert str(e.value) == (
    f'config.model.init_from: {files[".pth"]!r} needs torch to read, which '
    'is not installed; convert it once where torch is installed: python -m '
    f'models.pretrained --in {files[".pth"]} --out resnet18.npz'
  )


def test_converter_cli(files, tmp_path, capsys):
  out = str(tmp_path / 'converted.npz')
  assert pretrained.main(['--in', files['.pth'], '--out', out]) == 0
  assert 'keys=' in capsys.readouterr().out
  with pytest.raises(SystemExit):  # one-line usage error, no traceback
    pretrained.main(['--in', str(tmp_path / 'missing.pth'), '--out', out])
  want = pretrained.read_state_dict(files['.pth'])
  got = pretrained.read_state_dict(out)
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_reference_schedule_smoke_run_from_converted_file(files, tmp_path):
  """Frozen then unfrozen from a converted file: backbone exact after phase 1, trained after.
  Batch 256: 5 steps an epoch (a step's cost is the full-width model's 11M parameters, not its
  images); both phases, each saved at its end."""
  import orbax.checkpoint as ocp

  from configs import digits, validation
  from trainer import checkpoint, train

  config = digits.get_config('smoke')
  config.model.width = 1.0
  config.model.init_from = str(files['.npz'])
  config.num_epochs, config.optim.freeze_epochs, config.batch_size = 2, 1, 256
  workdir = tmp_path / 'w'
  results = train.train_and_evaluate(validation.resolve(config), str(workdir))
  assert results['status'] == 'completed' and results['model']['reinit'] == ['stem', 'head']
  loaded = pretrained.read_state_dict(files['.npz'])
  mngr = checkpoint.manager(str(workdir), 3)
  steps = mngr.all_steps()

  def state_at(step):
    return mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))['state']

  frozen, unfrozen = state_at(steps[0]), state_at(steps[-1])

  def kernel(s):
    return np.asarray(s['params']['layer3']['0']['conv1']['kernel'])

  want = np.transpose(loaded['layer3.0.conv1.weight'], (2, 3, 1, 0))
  np.testing.assert_array_equal(kernel(frozen), want)
  assert not np.array_equal(kernel(unfrozen), want)
