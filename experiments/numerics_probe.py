"""Each numerics setting's error against a float64 reference, on the current backend.

  python -m experiments.numerics_probe --out /tmp/numerics        # about a minute on a 2-core CPU
  python -m experiments.numerics_probe --out DIR --model-settings all --model-width 0.5   # more

Measures, for every setting (native `jax_default_matmul_precision` values and the emulated formats
of numerics/emulate.py, each by its reference implementation, `emu:`, and by its fast one, `fast:`,
where the format has one): matmuls of ResNet-18's reduction lengths (64 ... 512*9), every distinct
ResNet-18 convolution shape and the fc layer, and a small ResNet-18's logits and parameter
gradients (one training-mode step). Error = ||y - y64|| / ||y64|| (relative L2) against float64
(numpy for the products; JAX float64 on the CPU for the model, whose BatchNorm and pooling stay
f32 in every setting, so the model rows measure the products' formats). Pairs of settings that
should agree (an emulated format and the native one it reproduces; the fast and the reference
implementation of a format) are compared directly: on a GPU or TPU, `fast:* vs <native>` is the
fidelity of the fast path against the hardware's own arithmetic.
Writes numerics.md, numerics.json and numerics_error.{png,pdf} to --out.
Reference: docs/numerics.md "Experiments on the numerics".
"""

import argparse
import functools
import json
import os
import sys
import time

from numerics import formats  # names only: no JAX

# name: (jax_default_matmul_precision, product format, emulate_impl). Presets set dots only; convs
# then run at default.
SETTINGS = {
  'default': ('default', 'native', 'auto'),
  'high': ('high', 'native', 'auto'),
  'highest': ('highest', 'native', 'auto'),
  'BF16_BF16_F32': ('BF16_BF16_F32', 'native', 'auto'),
  'TF32_TF32_F32': ('TF32_TF32_F32', 'native', 'auto'),
  **{f'emu:{m}': ('highest', m, 'reference') for m in ('bf16', 'bf16_3x', 'tf32', 'f32')},
  **{f'fast:{m}': ('highest', m, 'fast') for m in formats.FAST_FORMATS},
}


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m experiments.numerics_probe',
    description=' '.join(__doc__.split('\n\n')[0].split()),
  )
  p.add_argument('--out', default='runs/numerics', help='folder for the table, JSON and figure')
  p.add_argument('--settings', default=','.join(SETTINGS), help='comma-separated subset')
  p.add_argument('--rows', type=int, default=128, help='matmul rows (output rows)')
  p.add_argument('--cols', type=int, default=64, help='matmul columns')
  p.add_argument('--classes', type=int, default=1000, help='fc outputs (CelebA identity: 10177)')
  p.add_argument('--conv-spatial', type=int, default=4, help='conv output height and width')
  p.add_argument('--conv-batch', type=int, default=2, help='conv batch')
  p.add_argument('--model-width', type=float, default=0.125, help='model rows: model.width')
  p.add_argument('--model-image', type=int, default=8, help='model rows: image size')
  p.add_argument('--model-batch', type=int, default=8, help='model rows: batch')
  p.add_argument('--model-classes', type=int, default=10, help='model rows: classes')
  p.add_argument(
    '--model-settings',
    default='default,emu:bf16,emu:tf32',
    help="settings for the model rows ('all': every one of --settings; each costs a "
    "ResNet-18 forward/backward compile, ~10-30 s on a small CPU; '': none)",
  )
  p.add_argument('--seed', type=int, default=0, help='seed of the random operands')
  args = p.parse_args(argv)
  if args.model_settings == 'all':
    args.model_settings = args.settings
  unknown = [
    s for s in (args.settings + ',' + args.model_settings).split(',') if s and s not in SETTINGS
  ]
  if unknown:
    p.error(f'--settings: unknown {unknown}; choose from {list(SETTINGS)}')
  return args


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX
  parse_args(sys.argv[1:])

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import numerics_probe_products as products
from experiments import numerics_probe_report as probe_report
from models.resnet import ResNet18
from numerics import emulate

# (emulated, native) pairs whose agreement on a backend says the emulation reproduces it there,
# for both implementations, and each fast implementation against its reference.
PAIRS = tuple(
  (f'{impl}:{m}', native)
  for impl in ('emu', 'fast')
  for m, native in (
    ('bf16', 'default'),
    ('bf16', 'BF16_BF16_F32'),
    ('bf16_3x', 'high'),
    ('tf32', 'default'),
    ('tf32', 'TF32_TF32_F32'),
    ('f32', 'highest'),
  )
  if f'{impl}:{m}' in SETTINGS
) + tuple((f'fast:{m}', f'emu:{m}') for m in emulate.FAST_FORMATS)
MATMUL_K = (64, 128, 147, 256, 512, 576, 1152, 2304, 4608)


def rel_err(y, ref):
  """||y - ref|| / ||ref|| in float64."""
  y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


NO_DIFFERENCE = 'no difference'  # the 'worst layer' of a pair whose layers all agree exactly
_START = [time.time()]  # when main started: the progress lines' clock


def progress(message):
  """One line on stderr, with the seconds since the probe started (each setting compiles for
  seconds to a minute on a small CPU: the console shows what it is doing)."""
  print(f'[{time.time() - _START[0]:5.0f} s] {message}', file=sys.stderr, flush=True)


def run_setting(setting, fn, *args, what='products'):
  """fn(*args, fmt, impl) jitted and run under the setting's precision flag; None if
  unsupported."""
  progress(f'{what}: {setting}')
  precision, fmt, impl = SETTINGS[setting]
  try:
    with jax.default_matmul_precision(precision):
      out = jax.jit(lambda *a: fn(*a, fmt, impl))(*args)
      return jax.tree.map(np.asarray, jax.block_until_ready(out))
  except Exception as e:  # e.g. a preset the backend lacks
    print(f'  {setting}: unsupported here ({str(e).splitlines()[0][:100]})', file=sys.stderr)
    return None


def measure_products(settings, args, rng):
  """({setting: {K: err}} for matmuls, [{name, K, setting: err}] for layers, {setting: outputs}).

  All products of one setting are compiled as one program (one compile per setting).
  """
  cases = products.product_cases(args, rng, MATMUL_K)
  fns = [c[3] for c in cases]

  def both(xs, ws, fmt, impl):
    return [f(x, w, fmt, impl) for f, x, w in zip(fns, xs, ws, strict=True)]

  xs, ws = [c[4] for c in cases], [c[5] for c in cases]
  outs = {s: run_setting(s, both, xs, ws) for s in settings}
  matmul, layers = {s: {} for s in settings}, []
  for i, (kind, name, k, _, _, _, ref) in enumerate(cases):
    errs = {s: None if outs[s] is None else rel_err(outs[s][i], ref) for s in settings}
    if kind == 'matmul':
      for s in settings:
        matmul[s][k] = errs[s]
    else:
      layers.append({'name': name, 'K': k, **errs})
  return matmul, layers, {s: outs[s] or [] for s in settings}, [c[1] for c in cases]


def numpy_init(tree, rng):
  """Concrete values for an abstract ResNet-18 state, torchvision's init drawn with numpy.

  Conv kernels N(0, 2/fan_out), fc kernel and bias U(+-1/sqrt(in)), BatchNorm scale 1, bias 0,
  running mean 0, var 1. (Initialising in JAX compiles the threefry RNG for every parameter:
  about a minute on a small CPU, for values that do not matter here.)
  """
  fc_in = [a.shape[0] for a in jax.tree.leaves(tree) if a.ndim == 2] or [1]

  def fill(path, leaf):
    names = [str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path]
    shape, name = leaf.shape, [n for n in names if n != 'value'][-1]
    if len(shape) == 4:
      v = rng.standard_normal(shape) * np.sqrt(2.0 / (shape[0] * shape[1] * shape[3]))
    elif len(shape) == 2 or 'fc' in names:
      v = rng.uniform(-1, 1, shape) / np.sqrt(fc_in[0])
    else:
      v = np.ones(shape) if name in ('scale', 'var') else np.zeros(shape)
    return jnp.asarray(v, leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, tree)


def model_parts(args, fmt, dtype=jnp.float32, rng=None, impl='reference'):
  """(graphdef, params, rest) of the small ResNet-18 measured, in `dtype`.

  Abstract state (nnx.eval_shape: no compute) unless `rng` is given: then numpy_init's values.
  """

  def make():
    return ResNet18(
      args.model_classes,
      width=args.model_width,
      stem='small',
      dtype=dtype,
      param_dtype=dtype,
      conv_format=fmt,
      dense_format=fmt,
      emulate_impl=impl,
      rngs=nnx.Rngs(args.seed),
    )

  graphdef, params, rest = nnx.split(nnx.eval_shape(make), nnx.Param, ...)
  if rng is not None:
    params, rest = numpy_init(params, rng), numpy_init(rest, rng)
  return graphdef, params, rest


def model_step(graphdef, params, rest, x, y, fmt, impl):
  """loss_and_grads in run_setting's form (fmt and impl are the model's own: graphdef's)."""
  del fmt, impl
  return loss_and_grads(graphdef, params, rest, x, y)


def loss_and_grads(graphdef, params, rest, x, y):
  """(logits, grads): one training-mode forward/backward of mean cross-entropy."""
  model = nnx.merge(graphdef, params, rest)

  def loss_fn(m):
    logits = m(x)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)), logits

  (_, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  return logits, grads


def flat(tree):
  return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(tree)])


def measure_model(settings, args, rng):
  """{setting: {'logits': err, 'grads': err}} against the float64 model, plus outputs for pairs."""
  x = rng.standard_normal((args.model_batch, args.model_image, args.model_image, 3))
  x = x.astype(np.float32)
  y = (np.arange(args.model_batch) % args.model_classes).astype(np.int32)
  _, params32, rest32 = model_parts(args, 'native', rng=rng)
  cpu = jax.devices('cpu')[0]
  progress('model: float64 reference')
  with jax.enable_x64(True):
    graphdef64, _, _ = model_parts(args, 'native', jnp.float64)

    def cast(tree):
      return jax.device_put(jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), tree), cpu)

    ref = jax.jit(lambda *a: loss_and_grads(graphdef64, *a))(
      cast(params32),
      cast(rest32),
      jax.device_put(x.astype(np.float64), cpu),
      jax.device_put(y, cpu),
    )
    ref_logits, ref_grads = np.asarray(ref[0]), flat(ref[1])
  errs, outs = {}, {}
  for s in settings:
    graphdef, _, _ = model_parts(args, SETTINGS[s][1], impl=SETTINGS[s][2])
    fn = functools.partial(model_step, graphdef)
    out = run_setting(s, fn, params32, rest32, x, y, what='model')
    outs[s] = out
    errs[s] = (
      None
      if out is None
      else {'logits': rel_err(out[0], ref_logits), 'grads': rel_err(flat(out[1]), ref_grads)}
    )
  return errs, outs


def pair_diffs(outs, model_outs, settings, names):
  """Per pair: worst ||a - b|| / ||b|| over the matmuls and over the layers (with which layer),
  and the model's logits and gradients difference."""
  rows = []
  for a, b in PAIRS:
    if a not in settings or b not in settings or not outs[a] or not outs[b]:
      continue
    diffs = [(rel_err(p, q), n) for p, q, n in zip(outs[a], outs[b], names, strict=True)]
    mm = [d for d, n in diffs if n.startswith('K=')]
    layer = max((d, n) for d, n in diffs if not n.startswith('K='))
    row = {
      'pair': f'{a} vs {b}',
      'matmuls': max(mm),
      'layers': layer[0],
      'worst layer': layer[1] if layer[0] > 0 else NO_DIFFERENCE,
    }
    ma, mb = model_outs.get(a), model_outs.get(b)
    ok = ma is not None and mb is not None
    row['logits'] = rel_err(ma[0], mb[0]) if ok else None
    row['grads'] = rel_err(flat(ma[1]), flat(mb[1])) if ok else None
    rows.append(row)
  return rows


def figure(result, out_dir):
  """Error vs reduction length per setting: matmuls and layers, log-log."""
  import matplotlib.pyplot as plt

  from analysis.figures import style

  style.apply()
  colors = style.arm_colors(result['settings'])
  fig, axes = plt.subplots(1, 2, figsize=(style.WIDTH_IN, 2.6), sharey=True)
  for s in result['settings']:
    ks = [k for k in MATMUL_K if result['matmul'][s][k] is not None]
    dashed = {'emu': '--', 'fast': ':'}.get(s.split(':')[0], '-')
    axes[0].plot(
      ks,
      [max(result['matmul'][s][k], 1e-12) for k in ks],
      dashed,
      marker='o',
      ms=2.5,
      color=colors[s],
      label=s,
    )
    rows = sorted((r['K'], r[s]) for r in result['layers'] if r[s] is not None)
    axes[1].plot(
      [k for k, _ in rows],
      [max(e, 1e-12) for _, e in rows],
      dashed,
      marker='o',
      ms=2.5,
      color=colors[s],
    )
  for ax, title in zip(axes, ('matmul (random normal)', 'ResNet-18 conv/fc shapes'), strict=True):
    ax.set(xscale='log', yscale='log', xlabel='reduction length K', title=title)
  axes[0].set_ylabel('relative L2 error vs float64')
  handles, labels = axes[0].get_legend_handles_labels()  # below the axes: it covers no line
  fig.legend(
    handles,
    labels,
    loc='upper center',
    bbox_to_anchor=(0.5, 0.0),
    ncol=min(len(labels), 4),
    frameon=False,
  )
  fig.suptitle(f'{result["info"]["platform"]} ({result["info"]["device_kind"]})', fontsize=8)
  return style.save(fig, out_dir, 'numerics_error')


def main(argv=None):
  args = parse_args(argv)
  settings = args.settings.split(',')
  device = jax.devices()[0]
  info = {
    'platform': device.platform,
    'device_kind': device.device_kind,
    'jax': jax.__version__,
    'args': vars(args),
  }
  rng = np.random.default_rng(args.seed)
  start = _START[0] = time.time()
  progress(
    f'{len(settings)} settings on {device.platform}: one compile each (products), then '
    f'{len([s for s in args.model_settings.split(",") if s])} model setting(s)'
  )
  matmul, layers, outs, names = measure_products(settings, args, rng)
  model_settings = [s for s in args.model_settings.split(',') if s]
  model, model_outs = measure_model(model_settings, args, rng) if model_settings else ({}, {})
  result = {
    'info': info,
    'settings': settings,
    'matmul': matmul,
    'layers': layers,
    'model': model,
    'pairs': pair_diffs(outs, model_outs, settings, names),
  }
  info['seconds'] = round(time.time() - start, 1)
  os.makedirs(args.out, exist_ok=True)
  report = probe_report.markdown(result, MATMUL_K)
  print(report)
  with open(os.path.join(args.out, 'numerics.md'), 'w') as f:
    f.write(report)
  with open(os.path.join(args.out, 'numerics.json'), 'w') as f:
    json.dump(result, f, indent=1, default=str)
  for path in figure(result, args.out):
    print(f'wrote {path}')
  print(f'({info["seconds"]} s)')


if __name__ == '__main__':
  main()
