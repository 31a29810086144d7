"""Statistics, attribution, reports and figures over the runs' Orbax results (reading only)."""
