"""The registry's `resnet50`: torchvision's ResNet-50, built by models/resnet.py."""

from models import layers, resnet

TORCHVISION = 'ResNet-50'  # what its pretrained state dicts hold (models/pretrained.py)
PARTS = resnet.PARTS
torch_keys = layers.torch_keys
create = resnet.ResNet50.create
activation_values = resnet.ResNet50.activation_values
