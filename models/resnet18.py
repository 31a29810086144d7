"""The registry's `resnet18`: torchvision's ResNet-18, built by models/resnet.py."""

from models import layers, resnet

TORCHVISION = 'ResNet-18'  # what its pretrained state dicts hold (models/pretrained.py)
PARTS = resnet.PARTS
torch_keys = layers.torch_keys


def create(config, num_classes, in_channels, rngs):
  return resnet.ResNet18(num_classes, in_channels=in_channels, rngs=rngs, **resnet.options(config))


def activation_values(config):
  return resnet.activation_values(resnet.ResNet18, config)
