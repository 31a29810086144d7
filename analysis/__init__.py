"""Statistics, figures and sweeps over the runs' Orbax results."""
