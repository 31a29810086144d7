"""Input pipelines: each dataset is one module declaring itself (input_pipeline/registry.py), its
loader returning a `base.Dataset`; `batching` feeds the devices. See docs/configs.md ("Adding a
dataset") and docs/celeba.md."""
