"""Models: ResNet-18 (torchvision-compatible) in flax.nnx."""
