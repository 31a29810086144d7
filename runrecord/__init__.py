"""The run record, one owner for what a run leaves behind and how it is read (record.py, rules.py):
training writes it, analysis/ and sweeps/ read it without trainer/."""
