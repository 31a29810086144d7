"""This project's training step against PyTorch's (eager and torch.compile): the same torchvision
ResNet (model.name resnet18 or resnet50), batch, resolution and precision in one process, timed in
alternating windows; `torch_resnet18` and `torch_resnet50` are also the tests' PyTorch references.
Reference: docs/performance.md "The benchmark scripts".

  python -m benchmarks.bench_vs_torch --steps 5 --matmul-precision highest      # CPU: 64^2, f32
  python -m benchmarks.bench_vs_torch --image-size 224 --batch 256 --compute-dtype bfloat16   # GPU
"""

import statistics
import time
import traceback

import numpy as np

from benchmarks import bench_step, common


def torch_resnet(bottleneck=False, blocks=(2, 2, 2, 2), num_classes=1000, width=1.0):
  """torchvision's ResNet in plain torch.nn (torchvision cannot be installed beside this torch): its
  architecture, module names, state_dict keys and initialisation (docs/performance.md)."""
  import torch
  from torch import nn

  from models import resnet

  class Block(nn.Module):
    expansion = 4 if bottleneck else 1

    def __init__(self, cin, c, stride):
      super().__init__()
      out = c * self.expansion
      convs = [(cin, c, 3, stride, 1), (c, c, 3, 1, 1)]  # (in, out, kernel, stride, padding)
      if bottleneck:  # torchvision's v1.5: the stride on the 3x3
        convs = [(cin, c, 1, 1, 0), (c, c, 3, stride, 1), (c, out, 1, 1, 0)]
      for i, (a, b, k, s, p) in enumerate(convs, 1):
        setattr(self, f'conv{i}', nn.Conv2d(a, b, k, s, p, bias=False))
        setattr(self, f'bn{i}', nn.BatchNorm2d(b))
      self.relu = nn.ReLU(inplace=True)
      self.downsample = None
      if stride != 1 or cin != out:
        self.downsample = nn.Sequential(
          nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out)
        )

    def forward(self, x):
      y = self.relu(self.bn1(self.conv1(x)))
      y = self.bn2(self.conv2(y))
      if bottleneck:
        y = self.bn3(self.conv3(self.relu(y)))
      return self.relu(y + (x if self.downsample is None else self.downsample(x)))

  class ResNet(nn.Module):
    def __init__(self):
      super().__init__()
      ch = resnet.stage_channels(width)
      self.conv1 = nn.Conv2d(3, ch[0], 7, 2, 3, bias=False)
      self.bn1 = nn.BatchNorm2d(ch[0])
      self.relu = nn.ReLU(inplace=True)
      self.maxpool = nn.MaxPool2d(3, 2, 1)
      layers, prev = [], ch[0]
      for i, (c, n) in enumerate(zip(ch, blocks, strict=True)):
        stage = [Block(prev, c, 2 if i else 1)]
        stage += [Block(c * Block.expansion, c, 1) for _ in range(n - 1)]
        layers.append(nn.Sequential(*stage))
        prev = c * Block.expansion
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

  return ResNet()


def torch_resnet18(num_classes=1000, width=1.0, blocks=(2, 2, 2, 2)):
  """torchvision's resnet18 (`blocks` (3, 4, 6, 3): resnet34)."""
  return torch_resnet(False, blocks, num_classes, width)


def torch_resnet50(num_classes=1000, width=1.0):
  """torchvision's resnet50: bottlenecks, (3, 4, 6, 3) per stage."""
  return torch_resnet(True, (3, 4, 6, 3), num_classes, width)


REFERENCES = {'resnet18': torch_resnet18, 'resnet50': torch_resnet50}  # model.name -> torch model


class TorchStep:
  """A torch training step on one synthetic uint8 batch of `config`'s size; `run(n)` times n."""

  def __init__(self, config, device, num_classes, compiled):
    import torch

    self.device, size, n = torch.device(device), config.data.image_size, config.batch_size
    cuda = self.device.type == 'cuda'
    if cuda:
      tf32 = config.numerics.matmul_precision != 'highest'
      torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
      torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = REFERENCES[config.model.name](num_classes, config.model.width).to(self.device)
    self.model = model.to(memory_format=torch.channels_last)
    kind = {'fused': True} if cuda else {'foreach': True}
    params = self.model.parameters()
    self.opt = torch.optim.AdamW(params, 1e-3, (0.9, 0.999), 1e-8, weight_decay=0.001, **kind)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    self.images = torch.from_numpy(images).to(self.device)  # NHWC uint8, as the JAX batch
    labels = rng.integers(0, num_classes, (n,)).astype(np.int64)
    self.labels = torch.from_numpy(labels).to(self.device)
    self.autocast = config.numerics.compute_dtype == 'bfloat16'
    self.step = torch.compile(self._step) if compiled else self._step
    self.compile_s = self.run(1)  # the first call compiles (torch.compile) or warms the caches

  def _step(self, images, labels):
    import torch

    x = images.permute(0, 3, 1, 2).float().div(255.0).sub(0.5).div(0.5)  # NHWC -> NCHW view
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
      loss = torch.nn.functional.cross_entropy(self.model(x), labels)
    loss.backward()
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    return loss.detach()

  def run(self, n):
    import torch

    start, loss = time.perf_counter(), None
    for _ in range(n):
      loss = self.step(self.images, self.labels)
    if loss is not None:
      loss.item()  # the host waits once, at the end of the window
    if self.device.type == 'cuda':
      torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None):
  parser = common.parser('bench_vs_torch', __doc__)
  common.add_step_args(parser)
  where = "torch's device (default: cuda where there is one)"
  parser.add_argument('--torch-device', default='', help=where)
  parser.add_argument('--no-compile', action='store_true', help='skip torch.compile')
  args, config = common.parse_step_config(parser, argv)
  native = {config.numerics.conv_format, config.numerics.dense_format} == {'native'}
  plain = native and config.model.stem == 'imagenet' and not config.data.flip and args.devices <= 1
  if config.model.name not in REFERENCES or not plain:
    common.fail(
      f'bench_vs_torch compares a model with a PyTorch reference ({", ".join(REFERENCES)}), '
      "native, with the ImageNet stem, on one device: model.stem 'imagenet', native product "
      'formats (no numerics.profile or *_format), no data.flip, --devices 0 or 1'
    )
  common.allocate_gpu_memory_on_demand()  # JAX would take 75 % of the GPU, leaving torch little
  import torch

  cuda = f', {torch.cuda.get_device_name(0)}' if torch.cuda.is_available() else ''
  torch_line = f'torch {torch.__version__}, threads {torch.get_num_threads()}{cuda}'
  common.command_line('bench_vs_torch', argv, f'{common.environment()} | {torch_line}')
  # JAX's step, torch eager and torch.compile alternately; speedup_vs_torch: best torch ms / JAX's
  device = args.torch_device or ('cuda' if torch.cuda.is_available() else 'cpu')
  args.devices = 1
  jax_step = bench_step.build_step(args, config)
  variants = {f'jax (this project, conv_impl {jax_step.conv_impl})': jax_step}
  variants['torch eager'] = TorchStep(config, device, args.num_classes, compiled=False)
  if not args.no_compile:
    try:
      variants['torch.compile'] = TorchStep(config, device, args.num_classes, compiled=True)
    except Exception as e:  # reported, its traceback on stderr; eager goes on alone
      traceback.print_exc()
      print(f'torch.compile failed ({type(e).__name__}; traceback on stderr)')
  times = common.alternate({name: v.run for name, v in variants.items()}, args)
  med = {name: statistics.median(t) for name, t in times.items()}
  jax_name = next(iter(variants))
  best = min((n for n in variants if n != jax_name), key=med.get)
  title = f'{bench_step.model_line(jax_step)}, compute {config.numerics.compute_dtype}, '
  title += f'matmul_precision {config.numerics.matmul_precision}, full training step; '
  rows = [
    [n, common.spread(times[n], 1e3, 1), f'{config.batch_size / med[n]:.1f}', f'{v.compile_s:.1f}']
    for n, v in variants.items()
  ]
  common.report(
    title + common.windows(args),
    ['variant', 'ms/step median (min-max)', 'images/s', 'first call (s)'],
    rows,
    f'best torch variant: {best}',
    f'speedup_vs_torch={med[best] / med[jax_name]:.3f}',
  )


if __name__ == '__main__':
  main()
