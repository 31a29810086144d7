"""What the tests share and no test file defines: planted runs, tables and predictions, the
commands' helpers, the fault-injection train.py, and the checks the CPU and GPU tiers both run."""
