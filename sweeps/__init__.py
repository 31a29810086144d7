"""Launchers: a study's runs (arms x seeds) as train.py processes, their checks, its cost
estimate, the whole-study command (sweep, then the analysis) and the TPU preflight. See
docs/operations.md ("Sweeps and studies") and docs/tpu.md."""
