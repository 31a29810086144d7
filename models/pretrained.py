"""ImageNet-pretrained ResNet-18 weights from a local torchvision-keyed file.

Reads a torchvision (or timm: same keys) ResNet-18 state dict from `.pth` (needs torch),
`.safetensors` or `.npz` (no torch needed) into `models.resnet.ResNet18` (OIHW -> HWIO, fc
transposed, BatchNorm running statistics kept). Nothing is downloaded.

  model = load_torchvision('resnet18.pth')                 # 1000 classes, eval mode
  facts = load_into(model, 'resnet18.npz', ('stem', 'head'))  # into an existing model
  python -m models.pretrained --in resnet18.pth --out resnet18.npz  # once, where torch is

See docs/celeba.md ("Starting from ImageNet-pretrained weights").
"""

import argparse
import hashlib
import os
import pickle
import re
import sys
import warnings


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m models.pretrained',
    description='Convert a torchvision ResNet-18 state dict (.pth/.safetensors/.npz) to a file '
    'that loads without torch (.npz or .safetensors).',
  )
  parser.add_argument('--in', dest='src', required=True, help='input state dict')
  parser.add_argument('--out', dest='dst', required=True, help='output .npz or .safetensors')
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  make_parser().parse_args()

import jax.numpy as jnp  # noqa: E402 (after --help: it answers without JAX)
import numpy as np  # noqa: E402 (after --help: it answers without JAX)
from flax import nnx  # noqa: E402 (after --help: it answers without JAX)

from models import architecture, resnet  # noqa: E402 (after --help: it answers without JAX)
from models.layers import BatchNorm, Conv2d, Linear  # noqa: E402 (after --help: it answers without JAX)

FORMATS = ('.pth', '.pt', '.safetensors', '.npz')
REINIT_PARTS = architecture.PARTS
IGNORED_SUFFIX = '.num_batches_tracked'
_BLOCK_KEY = re.compile(r'^layer([1-4])\.(\d+)\.(\w+)\.')
_SHOWN = 6  # keys named per category in an error message


def sha256(path):
  """Hex sha256 of the file at `path`."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _check_path(path, field):
  if not path or not os.path.isfile(path):
    raise FileNotFoundError(
      f'{field}: no file at {path!r}; give a torchvision ResNet-18 state '
      f'dict ({", ".join(FORMATS)})'
    )
  ext = os.path.splitext(path)[1].lower()
  if ext not in FORMATS:
    raise ValueError(f'{field}: unsupported file type {ext!r} of {path!r}; use one of {FORMATS}')
  return ext


# How to write each format so that it loads here (the fix named when a file does not read).
HOW_TO_SAVE = {
  '.pth': 'torch.save(model.state_dict(), path)',
  '.pt': 'torch.save(model.state_dict(), path)',
  '.safetensors': 'safetensors.torch.save_file(model.state_dict(), path)',
  '.npz': 'python -m models.pretrained --in resnet18.pth --out resnet18.npz',
}


class _Unreadable(ValueError):
  """_read_torch's own one-line error: the file and the fix (read_state_dict names the field)."""


def _read_torch(path):
  try:
    import torch
  except ImportError:
    raise _Unreadable(
      f'{path!r} needs torch to read, which is not installed; convert it once '
      f'where torch is installed: python -m models.pretrained --in {path} --out '
      'resnet18.npz'
    ) from None
  # weights_only: tensors and plain containers only, no code (a hostile pickle is refused).
  with warnings.catch_warnings():  # its unpickler warns about pickle protocols before refusing
    warnings.simplefilter('ignore', UserWarning)
    obj = torch.load(path, map_location='cpu', weights_only=True)
  if isinstance(obj, dict) and isinstance(obj.get('state_dict'), dict):
    obj = obj['state_dict']  # a training checkpoint wrapping the state dict
  if not isinstance(obj, dict):
    raise _Unreadable(
      f'{path!r} holds a {type(obj).__name__}, not a state dict; save model.state_dict()'
    )
  return {
    k: v.detach().cpu().float().numpy() if v.is_floating_point() else v.cpu().numpy()
    for k, v in obj.items()
    if isinstance(v, torch.Tensor)
  }


def _read(path, ext):
  """{key: array} of the file, by its format; any reader's failure propagates."""
  if ext in ('.pth', '.pt'):
    return _read_torch(path)
  if ext == '.safetensors':
    from safetensors.numpy import load_file

    return load_file(path)
  with np.load(path, allow_pickle=False) as data:  # no pickled objects: no code runs
    return {k: data[k] for k in data.files}


def read_state_dict(path, field='config.model.init_from'):
  """{torchvision key: np.ndarray} from a .pth/.pt, .safetensors or .npz file.

  Every failure is one ValueError line naming `field`, the file and the fix (a missing file:
  FileNotFoundError): a damaged or hostile file (a pickle that would run code, a truncated
  archive, a bad header) included, whatever its reader raised.
  """
  ext = _check_path(path, field)
  try:
    state = _read(path, ext)
  except _Unreadable as e:  # ours: the file and the fix
    raise ValueError(f'{field}: {e}') from None
  except Exception as e:  # each reader raises its own kinds
    detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
    if isinstance(e, pickle.UnpicklingError):  # torch's own text suggests weights_only=False
      detail = (
        'torch.load(weights_only=True) refused it: it holds more than tensors and plain '
        'containers (damaged, or code that would run)'
      )
    raise ValueError(
      f'{field}: {path!r} is not a readable {ext} state dict '
      f'({type(e).__name__}: {detail}); give a torchvision ResNet-18 state dict '
      f'written with {HOW_TO_SAVE[ext]}'
    ) from None
  # nn.DataParallel / DistributedDataParallel save every key under 'module.'.
  if state and all(k.startswith('module.') for k in state):
    state = {k[len('module.') :]: v for k, v in state.items()}
  return state


def check_architecture(state, path='the file'):
  """Raise one clear error unless `state` is a ResNet-18 (four stages of two basic blocks)."""
  blocks, bottleneck = {}, False
  for key in state:
    m = _BLOCK_KEY.match(key)
    if m:
      stage, block = int(m.group(1)), int(m.group(2))
      blocks[stage] = max(blocks.get(stage, 0), block + 1)
      bottleneck |= m.group(3) in ('conv3', 'bn3')
  found = tuple(blocks.get(s, 0) for s in (1, 2, 3, 4))
  if found == architecture.STAGE_BLOCKS and not bottleneck:
    return
  known = {
    ((2, 2, 2, 2), False): 'ResNet-18',
    ((3, 4, 6, 3), False): 'ResNet-34',
    ((3, 4, 6, 3), True): 'ResNet-50',
    ((3, 4, 23, 3), True): 'ResNet-101',
    ((3, 8, 36, 3), True): 'ResNet-152',
  }
  name = known.get((found, bottleneck), 'not a torchvision ResNet')
  kind = 'bottleneck' if bottleneck else 'basic'
  raise ValueError(
    f'config.model.init_from: {path} holds {name} ({kind} blocks per stage '
    f'{found}); only a torchvision ResNet-18 (basic blocks {architecture.STAGE_BLOCKS}) '
    'can be loaded'
  )


def _module_targets(prefix, module):
  """{torch key: (nnx Variable, to_nnx)} for one Conv2d, BatchNorm or Linear."""
  if isinstance(module, Conv2d):
    return {f'{prefix}.weight': (module.kernel, lambda w: w.transpose(2, 3, 1, 0))}
  if isinstance(module, Linear):
    return {
      f'{prefix}.weight': (module.kernel, lambda w: w.T),
      f'{prefix}.bias': (module.bias, lambda b: b),
    }
  if isinstance(module, BatchNorm):

    def same(v):
      return v

    return {
      f'{prefix}.weight': (module.scale, same),
      f'{prefix}.bias': (module.bias, same),
      f'{prefix}.running_mean': (module.mean, same),
      f'{prefix}.running_var': (module.var, same),
    }
  raise TypeError(f'{prefix}: unexpected module {type(module).__name__}')


def targets(model):
  """{torchvision key: (Variable, to_nnx)} for every weight and BN statistic of a ResNet18."""
  out = {}
  for name in architecture.STEM_NAMES + architecture.HEAD_NAMES:
    out.update(_module_targets(name, getattr(model, name)))
  for s in range(1, 5):
    for b, block in enumerate(getattr(model, f'layer{s}')):
      for name in ('conv1', 'bn1', 'conv2', 'bn2'):
        out.update(_module_targets(f'layer{s}.{b}.{name}', getattr(block, name)))
      if block.downsample is not None:
        for i, module in enumerate(block.downsample):
          out.update(_module_targets(f'layer{s}.{b}.downsample.{i}', module))
  return out


def _torch_shape(variable, key):
  """The torch-layout shape a file must hold for this nnx Variable."""
  shape = tuple(variable.shape)
  if key.endswith('.weight') and len(shape) == 4:
    return (shape[3], shape[2], shape[0], shape[1])  # HWIO -> OIHW
  if key.endswith('.weight') and len(shape) == 2:
    return shape[::-1]  # [in, out] -> [out, in]
  return shape


def _listed(keys):
  keys = sorted(keys)
  more = f' (+{len(keys) - _SHOWN} more)' if len(keys) > _SHOWN else ''
  return ', '.join(keys[:_SHOWN]) + more


def _reinit_keys(reinit):
  if isinstance(reinit, str):
    reinit = (reinit,) if reinit else ()
  bad = [p for p in reinit if p not in REINIT_PARTS]
  if bad:
    raise ValueError(
      f'config.model.reinit: unknown part(s) {bad}; choose from '
      f'{sorted(REINIT_PARTS)} (or () to load everything)'
    )
  return tuple(reinit), tuple(n for p in reinit for n in REINIT_PARTS[p])


def _check_width(model):
  channels = tuple(getattr(model, f'layer{s}')[0].bn2.scale.shape[0] for s in range(1, 5))
  if channels != architecture.STAGE_CHANNELS:
    raise ValueError(
      f'config.model.width must be 1.0 with config.model.init_from (stage channels '
      f'{channels}, the file has {architecture.STAGE_CHANNELS}); set model.width=1.0'
    )


def load_into(model, path, reinit=('stem', 'head')):
  """Copy the ResNet-18 weights and BN statistics at `path` into `model`, except `reinit` parts.

  `reinit` names parts that keep the model's own fresh initialisation: 'stem' (conv1, bn1) and/or
  'head' (fc). Every other key must be in the file with the model's shape; otherwise one error
  names the missing, unexpected and mismatched keys. Returns facts for the run's results.
  """
  state = read_state_dict(path)
  check_architecture(state, repr(path))
  return _copy_state(model, state, path, reinit)


def _copy_state(model, state, path, reinit):
  """load_into's work on an already-read state dict."""
  reinit, skipped_prefixes = _reinit_keys(reinit)
  _check_width(model)
  wanted = {k: v for k, v in targets(model).items() if k.split('.')[0] not in skipped_prefixes}
  present = {k for k in state if not k.endswith(IGNORED_SUFFIX)}
  skipped = {k for k in present if k.split('.')[0] in skipped_prefixes}
  missing = sorted(set(wanted) - present)
  unexpected = sorted(present - set(wanted) - skipped)
  mismatched = [
    f'{k} file {tuple(state[k].shape)} != model {_torch_shape(v, k)}'
    for k, (v, _) in sorted(wanted.items())
    if k in present and tuple(state[k].shape) != _torch_shape(v, k)
  ]
  if missing or unexpected or mismatched:
    parts = [
      f'{label}: {_listed(keys)}'
      for label, keys in (
        ('missing', missing),
        ('unexpected', unexpected),
        ('shape mismatch', mismatched),
      )
      if keys
    ]
    hint = (
      ' (add "stem"/"head" to config.model.reinit if the model\'s differ)' if mismatched else ''
    )
    raise ValueError(
      f'config.model.init_from {path!r} does not fit the model: ' + '; '.join(parts) + hint
    )
  for key, (variable, to_nnx) in wanted.items():
    value = to_nnx(np.asarray(state[key], np.float32))
    variable[...] = jnp.asarray(value, dtype=variable.dtype)
  return {
    'init_from': os.path.abspath(path),
    'sha256': sha256(path)[:16],
    'keys_loaded': len(wanted),
    'keys_in_file': len(present),
    'reinit': list(reinit),
  }


def load_torchvision(path, num_classes=1000, *, rngs=None, **model_kwargs):
  """The NNX ResNet18 with the file's weights and BN statistics, in eval mode (NHWC f32 input).

  The head (fc) keeps a fresh initialisation when `num_classes` differs from the file's.
  `model_kwargs` go to `ResNet18` (e.g. dtype, conv_format); in_channels must be 3, width 1.0.
  """
  if model_kwargs.get('in_channels', 3) != 3:
    raise ValueError(
      f'in_channels must be 3 for a pretrained ResNet-18, got '
      f'{model_kwargs["in_channels"]}; load_into(..., reinit=("stem",)) instead'
    )
  if float(model_kwargs.get('width', 1.0)) != 1.0:
    raise ValueError(f'width must be 1.0 with a pretrained ResNet-18, got {model_kwargs["width"]}')
  state = read_state_dict(path)
  check_architecture(state, repr(path))
  if 'fc.weight' not in state:
    raise ValueError(f'config.model.init_from {path!r} has no fc.weight (missing: fc.weight)')
  file_classes = int(state['fc.weight'].shape[0])
  model = resnet.ResNet18(num_classes, rngs=rngs or nnx.Rngs(0), **model_kwargs)
  _copy_state(model, state, path, reinit=() if num_classes == file_classes else ('head',))
  model.eval()
  return model


def convert(src, dst):
  """Rewrite the ResNet-18 state dict at `src` as `dst` (.npz or .safetensors); returns facts."""
  state = read_state_dict(src, field='--in')
  check_architecture(state, repr(src))
  ext = os.path.splitext(dst)[1].lower()
  state = {k: np.ascontiguousarray(v) for k, v in state.items()}
  if ext == '.npz':
    np.savez(dst, **state)
  elif ext == '.safetensors':
    from safetensors.numpy import save_file

    save_file(state, dst)
  else:
    raise ValueError(f'--out must end in .npz or .safetensors, got {dst!r}')
  return {
    'in': src,
    'in_sha256': sha256(src)[:16],
    'out': dst,
    'out_sha256': sha256(dst)[:16],
    'keys': len(state),
  }


def main(argv=None):
  parser = make_parser()
  args = parser.parse_args(argv)
  try:
    facts = convert(args.src, args.dst)
  except (OSError, ValueError, ImportError) as e:
    parser.error(str(e))  # one line and exit status 2, no traceback
  print(' '.join(f'{k}={v}' for k, v in facts.items()))
  return 0


if __name__ == '__main__':
  sys.exit(main())
