"""The numbers of an analysis: statistics, the gap decomposition, attribution, agreement; the typed
result (result.py)."""
