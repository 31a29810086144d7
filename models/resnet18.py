"""The registry's `resnet18`: torchvision's ResNet-18, built by models/resnet.py."""

from models import layers, resnet

TORCHVISION = 'ResNet-18'  # what its pretrained state dicts hold (models/pretrained.py)
PARTS = resnet.PARTS
torch_keys = layers.torch_keys
create = resnet.ResNet18.create
activation_values = resnet.ResNet18.activation_values
