"""Numerics as configuration: the number formats and profiles (formats.py), the products every
layer calls (ops.py), JAX's flags and the record of a run's numerics (setup.py)."""
