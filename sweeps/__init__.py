"""Launchers: the sweep and the whole study, their checks and cost, and the TPU preflight."""
