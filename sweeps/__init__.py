"""Launchers: a study's runs (arms x seeds) as train.py processes, their checks, its cost
estimate, and the whole-study command (sweep, then the analysis)."""
