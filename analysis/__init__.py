"""The analysis of a study's runs: inputs, declaration, stats, attribution, agreement, report,
figures, and the commands analyse, attribute, draw and export (docs/statistics.md)."""
