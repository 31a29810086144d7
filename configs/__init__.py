"""Configs: the schema (common.py), the config files (digits.py, celeba.py), the loader and the
one resolution and check of a config (validation.py). See docs/configs.md."""
