"""ResNet-18's structure in numbers: the model names a config may give, the stage channels and
blocks, the two stems, the named parts (torchvision names) and the activation values one example
produces. No JAX here: the config checks (configs/validation.py) read these to bound a step's
memory before any model is built (docs/configs.md, "Resolution and checks"); models/resnet.py
builds the network from the same numbers.
"""

NAMES = ('resnet18',)  # config.model.name
STAGE_CHANNELS = (64, 128, 256, 512)
STAGE_BLOCKS = (2, 2, 2, 2)
STEMS = ('imagenet', 'small')  # 7x7/2 conv + 3x3/2 max-pool (torchvision); 3x3/1, no pool
STEM_NAMES = ('conv1', 'bn1')
HEAD_NAMES = ('fc',)
PARTS = {'stem': STEM_NAMES, 'head': HEAD_NAMES}  # named parts for `model.reinit` and freezing


def stage_channels(width):
  """The four stages' channel counts at `width` (at least 1 each)."""
  return [max(1, int(round(c * width))) for c in STAGE_CHANNELS]


def _conv_out(size, kernel, stride, padding):
  return (size + 2 * padding - kernel) // stride + 1


def conv_output_values(image_size, width=1.0, stem='imagenet'):
  """Values per example in the outputs of all convolutions of ResNet18(width, stem) on an
  image_size x image_size input (the structure of models/resnet.py `ResNet18`;
  tests/test_memory_checks.py checks it against the model). A lower bound on the activations a
  training step keeps for the backward pass: each BatchNorm and ReLU output adds about as much
  again."""
  channels = stage_channels(width)
  size = _conv_out(image_size, 7, 2, 3) if stem == 'imagenet' else image_size
  total = size * size * channels[0]
  if stem == 'imagenet':
    size = _conv_out(size, 3, 2, 1)  # the max-pool
  previous = channels[0]
  for index, (c, blocks) in enumerate(zip(channels, STAGE_BLOCKS, strict=True)):
    for b in range(blocks):
      stride = 2 if index and not b else 1
      size = _conv_out(size, 3, stride, 1)
      total += (2 + (stride != 1 or previous != c)) * size * size * c  # conv1, conv2, downsample
      previous = c
  return total


def first_conv_values(image_size, width=1.0, stem='imagenet'):
  """Values per example of the first convolution's input (one channel at least) and output
  (ResNet-18's largest: 64 x width channels at ceil(size / 2)^2 after the imagenet stem's 7x7/2,
  padding 3; size^2 after the small stem): what a forward pass holds for a whole batch at once."""
  side = -(-image_size // 2) if stem == 'imagenet' else image_size
  return side * side * stage_channels(width)[0] + image_size * image_size
