"""Models: ResNet-18 (torchvision-compatible) in flax.nnx, and its structure in numbers for the
config checks (models/architecture.py). See docs/configs.md."""
