"""Configs: the schema and loader (common.py), the config files, the one resolution
(validation.py)."""
