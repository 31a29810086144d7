"""Each numerics setting's error against a float64 reference, on the current backend.

  python -m experiments.numerics_probe --out /tmp/numerics        # about a minute on a 2-core CPU
  python -m experiments.numerics_probe --out DIR --model-settings all --model-width 0.5   # more

ResNet-18's matmuls, convolutions and fc layer, and a small model's logits and gradients, under
every setting. Writes numerics.{md,json} and numerics_error.{png,pdf} to --out (docs/numerics.md).
"""

import argparse
import contextlib
import functools
import sys
import time

import numpy as np

import experiments
from analysis import analyse as cli
from numerics import formats
from runrecord import files

# JAX, flax and the model load where they are used: --help and a bad flag are answered without.

FAST_FORMATS = [f for f, entry in formats.FORMATS.items() if entry.fast]  # with a fast form
# name: (jax_default_matmul_precision, product format, emulate_impl); presets set dots, not convs.
PRECISIONS = ('default', 'high', 'highest', 'BF16_BF16_F32', 'TF32_TF32_F32')  # flags, natively
SETTINGS = {
  **{p: (p, 'native', 'auto') for p in PRECISIONS},
  **{f'emu:{m}': ('highest', m, 'reference') for m, e in formats.FORMATS.items() if not e.noisy},
  **{f'fast:{m}': ('highest', m, 'fast') for m in FAST_FORMATS},
}
# (emulated, native) pairs whose agreement on a backend says the emulation reproduces it there,
# for both implementations, and each fast implementation against its reference; (format, native):
NATIVE_OF = [('bf16', 'default'), ('bf16', 'BF16_BF16_F32'), ('bf16_3x', 'high')]
NATIVE_OF += [('tf32', 'default'), ('tf32', 'TF32_TF32_F32'), ('f32', 'highest')]
PAIRS = tuple(
  (f'{i}:{m}', native) for i in ('emu', 'fast') for m, native in NATIVE_OF if f'{i}:{m}' in SETTINGS
) + tuple((f'fast:{m}', f'emu:{m}') for m in FAST_FORMATS)
MATMUL_K = (64, 128, 147, 256, 512, 576, 1152, 2304, 4608)
# ResNet-18's distinct convolutions (name, kernel, in, out, stride): the stem, layer1's, then each
# later layer's first (strided) 3x3, its other 3x3s and its 1x1 downsample.
CONVS = (('conv1', 7, 3, 64, 2), ('layer1', 3, 64, 64, 1)) + tuple(
  conv
  for n, c in ((2, 128), (3, 256), (4, 512))
  for conv in (
    (f'layer{n}.0.conv1', 3, c // 2, c, 2),
    (f'layer{n}', 3, c, c, 1),
    (f'layer{n}.ds', 1, c // 2, c, 2),
  )
)
NO_DIFFERENCE = 'no difference'  # the 'worst layer' of a pair whose layers all agree exactly
OUTPUTS = ['numerics.md', 'numerics.json', 'numerics_error.png', 'numerics_error.pdf']
_START = [time.time()]  # when main started: the progress lines' clock


def parse_args(argv):
  p = cli.Parser(
    prog='python -m experiments.numerics_probe',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument('--out', default='runs/numerics', help='folder for the table, JSON and figure')
  p.add_argument('--settings', default=','.join(SETTINGS), help='comma-separated subset')
  p.add_argument('--rows', type=int, default=128, help='matmul rows (output rows)')
  p.add_argument('--cols', type=int, default=64, help='matmul columns')
  p.add_argument('--classes', type=int, default=1000, help='fc outputs (CelebA identity: 10177)')
  p.add_argument('--conv-spatial', type=int, default=4, help='conv output height and width')
  p.add_argument('--conv-batch', type=int, default=2, help='conv batch')
  p.add_argument('--model', default='resnet18', help='model rows: model.name (models/)')
  p.add_argument('--model-width', type=float, default=0.125, help='model rows: model.width')
  p.add_argument('--model-image', type=int, default=8, help='model rows: image size')
  p.add_argument('--model-batch', type=int, default=8, help='model rows: batch')
  p.add_argument('--model-classes', type=int, default=10, help='model rows: classes')
  rows = "for the model rows ('all': --settings, '': none; each compiles, ~10-30 s on a CPU)"
  p.add_argument('--model-settings', default='default,emu:bf16,emu:tf32', help=rows)
  p.add_argument('--seed', type=int, default=0, help='seed of the random operands')
  args = p.parse_args(argv)
  if args.model_settings == 'all':
    args.model_settings = args.settings
  chosen = (args.settings + ',' + args.model_settings).split(',')
  if unknown := [s for s in chosen if s and s not in SETTINGS]:
    p.error(f'--settings: unknown {unknown}; choose from {list(SETTINGS)}')
  return args


def rel_err(y, ref):
  """||y - ref|| / ||ref|| in float64."""
  y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def progress(message):
  """One line on stderr with the seconds since the probe started (each setting compiles)."""
  print(f'[{time.time() - _START[0]:5.0f} s] {message}', file=sys.stderr, flush=True)


def run_setting(setting, fn, *args, what='products'):
  """fn(*args, fmt, impl) jitted and run under the setting's precision flag; None if unsupported."""
  import jax

  progress(f'{what}: {setting}')
  precision, fmt, impl = SETTINGS[setting]
  try:
    with jax.default_matmul_precision(precision):
      out = jax.jit(lambda *a: fn(*a, fmt, impl))(*args)
      return jax.tree.map(np.asarray, jax.block_until_ready(out))
  except Exception as e:  # e.g. a preset the backend lacks: a row of n/a, said here
    print(f'  {setting}: unsupported here ({str(e).splitlines()[0][:100]})', file=sys.stderr)
    return None


# --- the products: matmuls, ResNet-18's convolutions and fc layer, their float64 references ---
def kaiming(rng, shape, fan):
  return (rng.standard_normal(shape) * np.sqrt(2.0 / fan)).astype(np.float32)


def measure_products(settings, args, rng):
  """Errors of the matmuls per K and of the layers, the outputs, case names; one compile each."""
  from numerics import ops

  dense, cases = ops.dense, []
  for k in MATMUL_K:
    x, w = rng.standard_normal((args.rows, k)).astype(np.float32), kaiming(rng, (k, args.cols), k)
    cases.append(('matmul', f'K={k}', k, dense, x, w, x.astype(np.float64) @ w.astype(np.float64)))
  for name, kk, cin, cout, stride in CONVS:
    size = args.conv_spatial * stride  # input size; the output is conv_spatial, K does not care
    shape = (args.conv_batch, size, size, cin)
    x = rng.standard_normal(shape).astype(np.float32)
    x = x if name == 'conv1' else np.maximum(x, 0)  # post-ReLU-like: half zeros
    w, pad = kaiming(rng, (kk, kk, cin, cout), kk * kk * cout), kk // 2
    fn = functools.partial(ops.conv2d, stride=stride, padding=[(pad, pad)] * 2)
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))  # im2col
    win = np.lib.stride_tricks.sliding_window_view(xp, (kk, kk), axis=(1, 2))[:, ::stride, ::stride]
    ref = np.einsum('nhwcij,ijco->nhwo', win, w.astype(np.float64), optimize=True)
    cases.append(('layer', name, kk * kk * cin, fn, x, w, ref))
  x = np.maximum(rng.standard_normal((args.rows, 512)), 0).astype(np.float32)
  w = kaiming(rng, (512, args.classes), 512)
  cases.append(('layer', 'fc', 512, dense, x, w, x.astype(np.float64) @ w.astype(np.float64)))
  fns = [c[3] for c in cases]

  def every(xs, ws, fmt, impl):
    return [f(x, w, fmt=fmt, emulate_impl=impl) for f, x, w in zip(fns, xs, ws, strict=True)]

  outs = {s: run_setting(s, every, [c[4] for c in cases], [c[5] for c in cases]) for s in settings}
  matmul, layers = {s: {} for s in settings}, []
  for i, (kind, name, k, _, _, _, ref) in enumerate(cases):
    errs = {s: None if outs[s] is None else rel_err(outs[s][i], ref) for s in settings}
    if kind == 'matmul':
      for s in settings:
        matmul[s][k] = errs[s]
    else:
      layers.append({'name': name, 'K': k, **errs})
  return matmul, layers, {s: outs[s] or [] for s in settings}, [c[1] for c in cases]


# --- the model: a small ResNet-18's logits and gradients against float64 ---
def numpy_init(tree, rng):
  """torchvision's ResNet init drawn with numpy (JAX's would compile threefry per parameter)."""
  import jax
  import jax.numpy as jnp

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


def model_parts(args, fmt, dtype=None, rng=None, impl='reference'):
  """(graphdef, params, rest) of the small --model in `dtype`, abstract unless `rng` is given."""
  import jax.numpy as jnp
  from flax import nnx

  import models
  from configs import common

  config = common.base_config()
  config.model.name, config.model.width, config.model.stem = args.model, args.model_width, 'small'
  dtype = jnp.dtype(dtype or jnp.float32).name
  config.numerics.compute_dtype = config.numerics.param_dtype = dtype
  config.numerics.conv_format = config.numerics.dense_format = fmt
  config.numerics.emulate_impl = impl
  model = nnx.eval_shape(lambda: models.build(config, args.model_classes, 3, nnx.Rngs(args.seed)))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  if rng is not None:
    params, rest = numpy_init(params, rng), numpy_init(rest, rng)
  return graphdef, params, rest


def loss_and_grads(graphdef, params, rest, x, y):
  """(logits, grads): one training-mode forward/backward of mean cross-entropy."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  model = nnx.merge(graphdef, params, rest)

  def loss_fn(m):
    logits = m(x)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)), logits

  (_, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  return logits, grads


def flat(tree):
  import jax

  return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(tree)])


def measure_model(settings, args, rng):
  """{setting: {'logits': err, 'grads': err}} against float64 (BN stays f32), and the outputs."""
  import jax
  import jax.numpy as jnp

  x = rng.standard_normal((args.model_batch, args.model_image, args.model_image, 3))
  x = x.astype(np.float32)
  y = (np.arange(args.model_batch) % args.model_classes).astype(np.int32)
  _, params32, rest32 = model_parts(args, 'native', rng=rng)
  cpu = jax.devices('cpu')[0]
  progress('model: float64 reference')
  with jax.enable_x64(True):
    graphdef64, _, _ = model_parts(args, 'native', jnp.float64)
    f64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params32, rest32, x))
    ref = jax.jit(lambda *a: loss_and_grads(graphdef64, *a))(*jax.device_put((*f64, y), cpu))
    ref_logits, ref_grads = np.asarray(ref[0]), flat(ref[1])
  errs, outs = {}, {}
  for s in settings:
    graphdef, _, _ = model_parts(args, SETTINGS[s][1], impl=SETTINGS[s][2])

    def step(params, rest, x, y, fmt, impl, graphdef=graphdef):  # fmt, impl: graphdef's own
      return loss_and_grads(graphdef, params, rest, x, y)

    out = outs[s] = run_setting(s, step, params32, rest32, x, y, what='model')
    errs[s] = None
    if out is not None:
      errs[s] = {'logits': rel_err(out[0], ref_logits), 'grads': rel_err(flat(out[1]), ref_grads)}
  return errs, outs


def pair_diffs(outs, model_outs, settings, names):
  """Per pair: worst ||a - b|| / ||b|| of the matmuls and of the layers, the model's difference."""
  rows = []
  for a, b in PAIRS:
    if a not in settings or b not in settings or not outs[a] or not outs[b]:
      continue
    diffs = [(rel_err(p, q), n) for p, q, n in zip(outs[a], outs[b], names, strict=True)]
    layer = max((d, n) for d, n in diffs if not n.startswith('K='))
    ma, mb = model_outs.get(a), model_outs.get(b)
    ok = ma is not None and mb is not None
    rows.append(
      {
        'pair': f'{a} vs {b}',
        'matmuls': max(d for d, n in diffs if n.startswith('K=')),
        'layers': layer[0],
        'worst layer': layer[1] if layer[0] > 0 else NO_DIFFERENCE,
        'logits': rel_err(ma[0], mb[0]) if ok else None,
        'grads': rel_err(flat(ma[1]), flat(mb[1])) if ok else None,
      }
    )
  return rows


def fmt(v):
  return 'n/a' if v is None else ('0' if v == 0 else f'{v:.2e}')


def markdown(result):
  """Products by reduction length, layers, the model, pairs."""
  from analysis import report as tables

  settings, info = result['settings'], result['info']
  matmuls = [
    {'setting': s, **{f'K={k}': fmt(result['matmul'][s][k]) for k in MATMUL_K}} for s in settings
  ]
  layers = [
    {'layer': r['name'], 'K': str(r['K']), **{s: fmt(r[s]) for s in settings}}
    for r in result['layers']
  ]
  lines = [
    f'## Numerics on {info["platform"]} ({info["device_kind"]}), jax {info["jax"]}\n',
    'Relative L2 error against float64.\n',
    '### Matmuls [rows, K] @ [K, cols]\n',
    tables.markdown(matmuls),
    '\n### ResNet-18 layers (K = reduction length)\n',
    tables.markdown(layers),
  ]
  if result['model']:
    model = [
      {'setting': s, 'logits': fmt((e or {}).get('logits')), 'grads': fmt((e or {}).get('grads'))}
      for s, e in result['model'].items()
    ]
    name = info.get('args', {}).get('model', 'resnet18')
    lines += [f'\n### Small {name}, one training-mode step\n', tables.markdown(model)]
  pairs = [
    {k: (v if isinstance(v, str) else fmt(v)) for k, v in r.items()} for r in result['pairs']
  ]
  lines += [
    '\n### Emulated vs native (relative L2 difference; products: worst case)\n',
    tables.markdown(pairs),
  ]
  return '\n'.join(lines)


def figure(result, out_dir):
  """Error vs reduction length per setting: matmuls and layers, log-log."""
  import matplotlib.pyplot as plt

  from analysis import figures as style

  style.apply()
  colors = style.arm_colors(result['settings'])
  fig, axes = plt.subplots(1, 2, figsize=(style.WIDTH_IN, 2.6), sharey=True)
  for s in result['settings']:
    dashed = {'emu': '--', 'fast': ':'}.get(s.split(':')[0], '-')
    ks = [k for k in MATMUL_K if result['matmul'][s][k] is not None]
    errs = [max(result['matmul'][s][k], 1e-12) for k in ks]
    axes[0].plot(ks, errs, dashed, marker='o', ms=2.5, color=colors[s], label=s)
    rows = sorted((r['K'], r[s]) for r in result['layers'] if r[s] is not None)
    errs = [max(e, 1e-12) for _, e in rows]
    axes[1].plot([k for k, _ in rows], errs, dashed, marker='o', ms=2.5, color=colors[s])
  for ax, title in zip(axes, ('matmul (random normal)', 'ResNet-18 conv/fc shapes'), strict=True):
    ax.set(xscale='log', yscale='log', xlabel='reduction length K', title=title)
  axes[0].set_ylabel('relative L2 error vs float64')
  # Below the axes: it covers no line.
  fig.legend(loc='upper center', bbox_to_anchor=(0.5, 0.0), ncol=min(len(colors), 4), frameon=False)
  fig.suptitle(f'{result["info"]["platform"]} ({result["info"]["device_kind"]})', fontsize=8)
  return style.save(fig, out_dir, 'numerics_error')


def main(argv=None):
  args = parse_args(argv)
  import jax

  import models

  with contextlib.ExitStack() as stack:
    try:  # a bad --model or a user's file in the way: one line, before anything is measured
      if problem := models.missing(args.model):
        raise ValueError(problem.replace('config.model.name', '--model'))
      dest = stack.enter_context(
        files.Destination(args.out, command='numerics_probe', may_write=OUTPUTS)
      )
    except ValueError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    settings = args.settings.split(',')
    model_settings = [s for s in args.model_settings.split(',') if s]
    device = jax.devices()[0]
    info = {'platform': device.platform, 'device_kind': device.device_kind, 'jax': jax.__version__}
    info['args'] = vars(args)
    rng = np.random.default_rng(args.seed)
    start = _START[0] = time.time()
    progress(
      f'{len(settings)} settings on {device.platform}: one compile each (products), then '
      f'{len(model_settings)} model setting(s)'
    )
    matmul, layers, outs, names = measure_products(settings, args, rng)
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
    print(markdown(result))
    if experiments.write_report(dest, result, 'numerics', markdown, figure):
      return 1
  print(f'({info["seconds"]} s)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
