"""train.py with the faults of TRAIN_FAULT installed (tests/support/fault_injection.py): the same
command line as train.py, e.g. `TRAIN_FAULT=kill@save:12 python tests/support/fault_train.py
--config=... --workdir=...`."""

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.support import fault_injection  # noqa: E402 (importable once ROOT is on sys.path)

if __name__ == '__main__':
  fault_injection.install(os.environ.get('TRAIN_FAULT', ''))
  sys.argv[0] = os.path.join(ROOT, 'train.py')
  runpy.run_path(sys.argv[0], run_name='__main__')
