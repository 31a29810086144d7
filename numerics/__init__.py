"""Numerics as configuration: JAX flags, emulated product formats, and their records. See
docs/numerics.md."""
