"""Pretrained torchvision weights from a local file (.pth/.pt with torch; .safetensors or .npz
without) into a model of the registry, by its `torch_keys`; and their conversion to .npz."""

import argparse
import hashlib
import os
import pickle
import re
import sys
import warnings

import numpy as np

import models

FORMATS = ('.pth', '.pt', '.safetensors', '.npz')
IGNORED_SUFFIX = '.num_batches_tracked'
_BLOCK_KEY = re.compile(r'^layer([1-4])\.(\d+)\.(\w+)\.')
_SHOWN = 6  # keys named per category in an error message
RESNETS = {  # torchvision's ResNets by (blocks per stage, bottleneck)
  ((2, 2, 2, 2), False): 'ResNet-18',
  ((3, 4, 6, 3), False): 'ResNet-34',
  ((3, 4, 6, 3), True): 'ResNet-50',
  ((3, 4, 23, 3), True): 'ResNet-101',
  ((3, 8, 36, 3), True): 'ResNet-152',
}
# How to write each format so that it loads here (the fix named when a file does not read).
HOW_TO_SAVE = {
  '.pth': 'torch.save(model.state_dict(), path)',
  '.pt': 'torch.save(model.state_dict(), path)',
  '.safetensors': 'safetensors.torch.save_file(model.state_dict(), path)',
  '.npz': 'python -m models.pretrained --in resnet18.pth --out resnet18.npz',
}


class WeightsError(ValueError):
  """A weights file that cannot be read or does not fit the model: one line, the fix included."""


def _read_torch(path):
  try:
    import torch
  except ImportError as e:
    raise WeightsError(
      f'{path!r} needs torch to read, which is not installed; convert it once '
      f'where torch is installed: python -m models.pretrained --in {path} --out '
      'resnet18.npz'
    ) from e
  # weights_only: tensors and plain containers only, no code (a hostile pickle is refused).
  with warnings.catch_warnings():  # its unpickler warns about pickle protocols before refusing
    warnings.simplefilter('ignore', UserWarning)
    obj = torch.load(path, map_location='cpu', weights_only=True)
  if isinstance(obj, dict) and isinstance(obj.get('state_dict'), dict):
    obj = obj['state_dict']  # a training checkpoint wrapping the state dict
  if not isinstance(obj, dict):
    raise WeightsError(
      f'{path!r} holds a {type(obj).__name__}, not a state dict; save model.state_dict()'
    )
  return {
    k: v.detach().cpu().float().numpy() if v.is_floating_point() else v.cpu().numpy()
    for k, v in obj.items()
    if isinstance(v, torch.Tensor)
  }


def read_state_dict(path, field='config.model.init_from'):
  """{torchvision key: np.ndarray} from a .pth/.pt, .safetensors or .npz file; any failure but a
  missing file one WeightsError line naming `field`, the file and the fix."""
  if not path or not os.path.isfile(path):
    raise FileNotFoundError(
      f'{field}: no file at {path!r}; give a torchvision state dict ({", ".join(FORMATS)})'
    )
  ext = os.path.splitext(path)[1].lower()
  if ext not in FORMATS:
    raise WeightsError(f'{field}: unsupported file type {ext!r} of {path!r}; use one of {FORMATS}')
  try:
    if ext in ('.pth', '.pt'):
      state = _read_torch(path)
    elif ext == '.safetensors':
      from safetensors.numpy import load_file

      state = load_file(path)
    else:
      with np.load(path, allow_pickle=False) as data:  # no pickled objects: no code runs
        state = {k: data[k] for k in data.files}
  except WeightsError as e:  # ours: the file and the fix
    raise WeightsError(f'{field}: {e}') from e
  except Exception as e:  # each reader raises its own kinds for a bad file
    detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
    if isinstance(e, pickle.UnpicklingError):  # torch's own text suggests weights_only=False
      detail = (
        'torch.load(weights_only=True) refused it: it holds more than tensors and plain '
        'containers (damaged, or code that would run)'
      )
    raise WeightsError(
      f'{field}: {path!r} is not a readable {ext} state dict '
      f'({type(e).__name__}: {detail}); give a torchvision state dict '
      f'written with {HOW_TO_SAVE[ext]}'
    ) from e
  # nn.DataParallel / DistributedDataParallel save every key under 'module.'.
  if state and all(k.startswith('module.') for k in state):
    state = {k[len('module.') :]: v for k, v in state.items()}
  return state


def resnet_of(state):
  """(torchvision ResNet name or 'not a torchvision ResNet', its block kind, blocks per stage)."""
  blocks, bottleneck = {}, False
  for key in state:
    m = _BLOCK_KEY.match(key)
    if m:
      stage, block = int(m.group(1)), int(m.group(2))
      blocks[stage] = max(blocks.get(stage, 0), block + 1)
      bottleneck |= m.group(3) in ('conv3', 'bn3')
  found = tuple(blocks.get(s, 0) for s in (1, 2, 3, 4))
  name = RESNETS.get((found, bottleneck), 'not a torchvision ResNet')
  return name, 'bottleneck' if bottleneck else 'basic', found


def _listed(keys):
  keys = sorted(keys)
  more = f' (+{len(keys) - _SHOWN} more)' if len(keys) > _SHOWN else ''
  return ', '.join(keys[:_SHOWN]) + more


def _torch_shape(variable, key):
  """The torch-layout shape a file must hold for this nnx Variable."""
  shape = tuple(variable.shape)
  if key.endswith('.weight') and len(shape) == 4:
    return (shape[3], shape[2], shape[0], shape[1])  # HWIO -> OIHW
  if key.endswith('.weight') and len(shape) == 2:
    return shape[::-1]  # [in, out] -> [out, in]
  return shape


def load_into(model, path, reinit=('stem', 'head'), name='resnet18'):
  """Copy the weights and BatchNorm statistics at `path` into `model` of `name`, but `reinit`."""
  module = models.get(name)
  if not hasattr(module, 'torch_keys'):
    raise WeightsError(
      f'config.model.init_from: {module.__name__} has no torch_keys: it loads no weights'
    )
  state = read_state_dict(path)
  expected = getattr(module, 'TORCHVISION', None)
  held, kind, blocks = resnet_of(state)
  if expected and held != expected:
    raise WeightsError(
      f'config.model.init_from: {path!r} holds {held} ({kind} blocks per stage {blocks}), not '
      f'the {expected} config.model.name={name!r} builds: give {expected} weights, or the '
      'model.name of the file'
    )
  return _copy_state(model, state, path, reinit, module)


def _copy_state(model, state, path, reinit, module):
  """load_into's work on an already-read state dict."""
  import jax.numpy as jnp

  reinit = (reinit,) if isinstance(reinit, str) and reinit else tuple(reinit or ())
  bad = [p for p in reinit if p not in module.PARTS]
  if bad:
    raise WeightsError(
      f'config.model.reinit: unknown part(s) {bad}; choose from '
      f'{sorted(module.PARTS)} (or () to load everything)'
    )
  skipped_prefixes = {n for p in reinit for n in module.PARTS[p]}
  wanted = {
    k: v for k, v in module.torch_keys(model).items() if k.split('.')[0] not in skipped_prefixes
  }
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
    found = {'missing': missing, 'unexpected': unexpected, 'shape mismatch': mismatched}
    parts = [f'{label}: {_listed(keys)}' for label, keys in found.items() if keys]
    hint = (
      ' (add "stem"/"head" to config.model.reinit if the model\'s differ)' if mismatched else ''
    )
    raise WeightsError(
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
  """The ResNet the file holds (18 or 50) with its weights and BatchNorm statistics, eval mode."""
  from flax import nnx

  if model_kwargs.get('in_channels', 3) != 3:
    raise WeightsError(
      f'in_channels must be 3 for a pretrained ResNet, got {model_kwargs["in_channels"]}; '
      'load_into(..., reinit=("stem",)) instead'
    )
  state = read_state_dict(path)
  held, kind, blocks = resnet_of(state)
  name = held.lower().replace('-', '')
  if models.missing(name) or 'fc.weight' not in state:
    raise WeightsError(
      f'{path!r} holds {held} ({kind} blocks per stage {blocks}): give ResNet-18 or ResNet-50 '
      'weights with their fc.weight'
    )
  from models import resnet

  module = models.get(name)
  file_classes = int(state['fc.weight'].shape[0])
  model = getattr(resnet, held.replace('-', ''))(
    num_classes, rngs=rngs or nnx.Rngs(0), **model_kwargs
  )
  _copy_state(model, state, path, () if num_classes == file_classes else ('head',), module)
  model.eval()
  return model


def sha256(path):
  """The file's SHA-256 (hex); models sit below runrecord/, whose files.sha256 is the same."""
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


def convert(src, dst):
  """Rewrite the state dict at `src` as `dst` (.npz or .safetensors); returns facts."""
  state = read_state_dict(src, field='--in')
  ext = os.path.splitext(dst)[1].lower()
  state = {k: np.ascontiguousarray(v) for k, v in state.items()}
  if ext == '.npz':
    np.savez(dst, **state)
  elif ext == '.safetensors':
    from safetensors.numpy import save_file

    save_file(state, dst)
  else:
    raise WeightsError(f'--out must end in .npz or .safetensors, got {dst!r}')
  return {
    'in': src,
    'in_sha256': sha256(src)[:16],
    'out': dst,
    'out_sha256': sha256(dst)[:16],
    'keys': len(state),
  }


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python -m models.pretrained',
    description='Convert a torchvision state dict (.pth/.safetensors/.npz) to a file that loads '
    'without torch (.npz or .safetensors).',
  )
  parser.add_argument('--in', dest='src', required=True, help='input state dict')
  parser.add_argument('--out', dest='dst', required=True, help='output .npz or .safetensors')
  args = parser.parse_args(argv)
  try:
    facts = convert(args.src, args.dst)
  except (OSError, WeightsError) as e:
    parser.error(str(e))  # one line and exit status 2, no traceback
  print(' '.join(f'{k}={v}' for k, v in facts.items()))
  return 0


if __name__ == '__main__':
  sys.exit(main())
