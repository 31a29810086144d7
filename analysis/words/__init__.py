"""The words of an analysis: the report, its one-page answer, the attribution in words, the tables
as text."""
