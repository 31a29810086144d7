"""This project's ResNet-18 training step against PyTorch's: same model, batch, resolution and
precision.

  python -m benchmarks.bench_vs_torch                                   # CPU: 64^2, batch 64, f32
  python -m benchmarks.bench_vs_torch --image-size 224 --batch 256 --precision bf16   # GPU

One process, alternating rounds: every round times `--steps` steps of each variant in turn (the
host blocks once per window), so a busy or throttling machine slows all variants alike. Variants:
  jax            this project's step (benchmarks.bench_step.JaxStep: the run context's step on
                 synthetic data, donated state); its config is loaded as bench_step loads it
                 (`--config`, default step_args.DEFAULT_CONFIG, and `--config.*` overrides), with
                 --image-size, --batch, --width, --conv-impl and --precision applied over it; the
                 torch model takes the loaded image size, batch and width
  torch eager    a torchvision-shaped ResNet-18 in plain torch.nn, channels-last, AdamW (fused on
                 CUDA, foreach elsewhere), the same uint8 -> normalised float preprocessing
  torch compile  the same under torch.compile (skipped, with the reason, where it fails)
Each step is a full training step: preprocess, forward, cross-entropy, backward, AdamW update.

--precision: 'f32' (JAX matmul_precision 'highest'; torch TF32 off), 'tf32' (JAX 'default', which
is TF32 on GPU; torch allow_tf32 on) or 'bf16' (JAX compute_dtype bfloat16 with f32 params and BN;
torch autocast bf16). On CPU only 'f32' is meaningful (both compute f32 whatever is asked).

Memory: JAX would preallocate 75 % of the GPU before torch allocates anything (at batch 2048 torch
then ran out of memory on an H100), so this benchmark sets XLA_PYTHON_CLIENT_PREALLOCATE=false
itself, before JAX starts, unless one of JAX's memory variables is set already (its environment
line says which settings applied).

Prints a Markdown table (median ms/step and images/s per variant) and, last,
`speedup_vs_torch=<float>`: the fastest torch variant's median ms/step over this project's
(> 1 means this project is faster).
Reference: docs/performance.md "The benchmark scripts".
"""

import argparse
import statistics
import time

from benchmarks import common, step_args

PRECISIONS = {  # --precision -> (JAX compute_dtype, JAX matmul_precision)
  'f32': ('float32', 'highest'),
  'tf32': ('float32', 'default'),
  'bf16': ('bfloat16', 'default'),
}


def make_parser():
  parser = argparse.ArgumentParser(
    prog='python -m benchmarks.bench_vs_torch', description=common.description(__doc__)
  )
  parser.add_argument('--image-size', type=int, help="data.image_size (default: the config's)")
  parser.add_argument('--batch', type=int, help="batch_size (default: the config's)")
  parser.add_argument('--width', type=float, help="model.width (default: the config's)")
  parser.add_argument('--num-classes', type=int, default=1000, help='classes of the synthetic data')
  parser.add_argument(
    '--precision',
    default='f32',
    choices=tuple(PRECISIONS),
    help='products and activations: f32, tf32 or bf16 (default f32)',
  )
  parser.add_argument('--conv-impl', help='numerics.conv_impl: auto|xla|im2col')
  parser.add_argument('--steps', type=int, default=5, help='steps per timed window')
  parser.add_argument('--rounds', type=int, default=5, help='alternating rounds (median)')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps after compiling')
  parser.add_argument('--no-compile', action='store_true', help='skip torch.compile')
  parser.add_argument('--torch-device', default=None, help="default: 'cuda' if available")
  return parser


if __name__ == '__main__':  # --help and a bad flag before the imports below load JAX and torch
  step_args.parse_flags(make_parser(), None)

import numpy as np

from benchmarks import bench_step


def torch_resnet18(num_classes=1000, width=1.0, blocks=(2, 2, 2, 2)):
  """torchvision.models.resnet18's architecture, module names and init, in plain torch.nn (no
  torchvision), so state_dict keys match torchvision's; `blocks` (3, 4, 6, 3) gives ResNet-34."""
  import torch  # torch, here and below, only once the benchmark runs: --help loads none of it
  from torch import nn

  class BasicBlock(nn.Module):
    def __init__(self, cin, c, stride):
      super().__init__()
      self.conv1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(c)
      self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(c)
      self.relu = nn.ReLU(inplace=True)
      self.downsample = None
      if stride != 1 or cin != c:
        self.downsample = nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
      y = self.relu(self.bn1(self.conv1(x)))
      y = self.bn2(self.conv2(y))
      return self.relu(y + (x if self.downsample is None else self.downsample(x)))

  class ResNet18(nn.Module):
    def __init__(self):
      super().__init__()
      ch = [max(1, int(round(c * width))) for c in (64, 128, 256, 512)]
      self.conv1 = nn.Conv2d(3, ch[0], 7, 2, 3, bias=False)
      self.bn1 = nn.BatchNorm2d(ch[0])
      self.relu = nn.ReLU(inplace=True)
      self.maxpool = nn.MaxPool2d(3, 2, 1)
      layers, prev = [], ch[0]
      for i, (c, n) in enumerate(zip(ch, blocks, strict=True)):
        stage = [BasicBlock(prev, c, 1 if i == 0 else 2)]
        stage += [BasicBlock(c, c, 1) for _ in range(n - 1)]
        layers.append(nn.Sequential(*stage))
        prev = c
      self.layer1, self.layer2, self.layer3, self.layer4 = layers
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.fc = nn.Linear(prev, num_classes)
      for m in self.modules():
        if isinstance(m, nn.Conv2d):
          nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')

    def forward(self, x):
      x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
      x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
      return self.fc(torch.flatten(self.avgpool(x), 1))

  return ResNet18()


class TorchStep:
  """A torch training step on one synthetic batch; `run(n)` times n steps."""

  def __init__(self, args, compiled):
    import torch

    self.torch = torch
    self.device = torch.device(args.torch_device)
    cuda = self.device.type == 'cuda'
    if cuda:
      tf32 = args.precision == 'tf32'
      torch.backends.cuda.matmul.allow_tf32 = tf32
      torch.backends.cudnn.allow_tf32 = tf32
      torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torch_resnet18(args.num_classes, args.width).to(self.device)
    self.model = model.to(memory_format=torch.channels_last)
    self.opt = torch.optim.AdamW(
      self.model.parameters(),
      lr=1e-3,
      betas=(0.9, 0.999),
      eps=1e-8,
      weight_decay=0.001,
      **({'fused': True} if cuda else {'foreach': True}),
    )
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.batch, args.image_size, args.image_size, 3), dtype=np.uint8)
    self.images = torch.from_numpy(images).to(self.device)  # NHWC uint8, like the JAX batch
    self.labels = torch.from_numpy(
      rng.integers(0, args.num_classes, (args.batch,)).astype(np.int64)
    ).to(self.device)
    self.autocast = args.precision == 'bf16'
    self.loss_fn = torch.nn.CrossEntropyLoss()
    step = self._step
    if compiled:
      step = torch.compile(step)
    self.step = step
    self.compile_s = None
    start = time.perf_counter()
    self.run(1)  # the first call compiles (torch.compile) or warms the caches (eager)
    self.compile_s = time.perf_counter() - start

  def _step(self, images, labels):
    torch = self.torch
    # uint8 NHWC -> normalised float NCHW in channels-last memory (a free permute).
    x = images.permute(0, 3, 1, 2).float().div(255.0).sub(0.5).div(0.5)
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
      loss = self.loss_fn(self.model(x), labels)
    loss.backward()
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    return loss.detach()

  def sync(self):
    if self.device.type == 'cuda':
      self.torch.cuda.synchronize()

  def run(self, n):
    start = time.perf_counter()
    loss = None
    for _ in range(n):
      loss = self.step(self.images, self.labels)
    if loss is not None:  # n = 0 (--warmup 0): nothing to wait for
      loss.item()  # the host waits once, at the end of the window
    self.sync()
    return time.perf_counter() - start


def torch_environment():
  import torch

  line = f'torch {torch.__version__}, threads {torch.get_num_threads()}'
  if torch.cuda.is_available():
    line += f', {torch.cuda.get_device_name(0)}, cuDNN {torch.backends.cudnn.version()}'
  return line


def jax_overrides(args):
  """The config fields the flags set: the shorthands given, and --precision's two fields."""
  compute_dtype, matmul_precision = PRECISIONS[args.precision]
  flags = tuple(
    p for p in step_args.SHORTHANDS if p[0] in ('image_size', 'batch', 'width', 'conv_impl')
  )
  return step_args.shorthand_overrides(args, flags) + [
    ('numerics.compute_dtype', compute_dtype),
    ('numerics.matmul_precision', matmul_precision),
  ]


def main(argv=None):
  common.allocate_gpu_memory_on_demand()  # before anything starts JAX's backend
  args, config = step_args.parse(make_parser(), argv, jax_overrides)
  formats = (config.numerics.conv_format, config.numerics.dense_format)  # resolved: explicit
  if config.model.stem != 'imagenet' or formats != ('native', 'native'):
    common.fail(
      'bench_vs_torch compares the native ImageNet-stem model: model.stem must be '
      "'imagenet' and native product formats (no numerics.profile or *_format)"
    )
  # The torch side takes the JAX side's sizes.
  args.image_size, args.batch = config.data.image_size, config.batch_size
  args.width = config.model.width

  import torch

  if args.torch_device is None:
    args.torch_device = 'cuda' if torch.cuda.is_available() else 'cpu'

  print(common.environment() + ' | ' + torch_environment())
  print(common.command_line('bench_vs_torch', argv))
  import jax

  variants, notes = {}, []
  jax_step = bench_step.build_step(config, jax.devices()[:1], num_classes=args.num_classes)
  variants['jax (this project, conv_impl %s)' % jax_step.conv_impl] = jax_step
  variants['torch eager'] = TorchStep(args, compiled=False)
  if not args.no_compile:
    try:
      variants['torch.compile'] = TorchStep(args, compiled=True)
    except Exception as e:  # report why and go on with eager
      notes.append(f'torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}')
  times = common.alternate(
    {name: v.run for name, v in variants.items()}, args.warmup, args.rounds, args.steps
  )

  med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
  jax_name = next(iter(variants))
  torch_names = [n for n in variants if n != jax_name]
  best = min(torch_names, key=med.get)
  print(
    f'ResNet-18 width {args.width:g}, {args.image_size}x{args.image_size}, batch '
    f'{args.batch}, {args.num_classes} classes, precision {args.precision}, full training '
    f'step (fwd+bwd+AdamW); {args.rounds} alternating rounds x {args.steps} steps'
  )
  print('| variant | ms/step (median) | min-max | images/s | first call (s) |')
  print('|---|---|---|---|---|')
  for name, v in variants.items():
    t = times[name]
    first = jax_step.compile_s if v is jax_step else v.compile_s
    print(
      f'| {name} | {med[name]:.1f} | {min(t) * 1e3:.1f}-{max(t) * 1e3:.1f} | '
      f'{args.batch / med[name] * 1e3:.1f} | {first:.1f} |'
    )
  for note in notes:
    print(note)
  print(f'best torch variant: {best}')
  print(f'speedup_vs_torch={med[best] / med[jax_name]:.3f}')


if __name__ == '__main__':
  main()
