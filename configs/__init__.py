"""Configs: the schema and the one loader (common.py), the config files (digits.py, celeba.py) and
the one resolution and check of a config (validation.py). See docs/configs.md."""
