"""Reading runs for analysis: run folders (Orbax records), CSV exports and study declarations."""
