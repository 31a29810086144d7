"""The analysis of a study's runs: inputs, declaration, stats, attribution, agreement, report,
figures, and the commands analyse, attribute, draw, export and findings (docs/statistics.md)."""
