"""The registry's `resnet50`: torchvision's ResNet-50, built by models/resnet.py."""

from models import layers, resnet

TORCHVISION = 'ResNet-50'  # what its pretrained state dicts hold (models/pretrained.py)
PARTS = resnet.PARTS
torch_keys = layers.torch_keys


def create(config, num_classes, in_channels, rngs):
  return resnet.ResNet50(num_classes, in_channels=in_channels, rngs=rngs, **resnet.options(config))


def activation_values(config):
  return resnet.activation_values(resnet.ResNet50, config)
