"""The run record, one owner for what a run leaves behind and how it is read: the results fields
and table columns, the arm, pairing and same-run rules, record upgrades, every workdir file name,
and the Orbax read and write of results (runrecord/record.py) and of test predictions
(runrecord/predictions.py). Training writes it; analysis/ and sweeps/ read it without trainer/."""
