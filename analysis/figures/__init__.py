"""The figures of an analysis, drawn at their printed size in one style (style.py)."""
