"""The results record, one owner: its fields (`Results`, `new_record`), the columns and field lists
the rules read (runrecord/rules.py), the workdir's file names, Orbax I/O, older records' upgrade,
and each evaluation's per-example test predictions (docs/record.md, "Test predictions")."""

import contextlib
import copy
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, cast

import numpy as np
from etils import epath

from numerics import formats

# Orbax (it loads JAX) is imported where used: an analysis of a CSV stays without JAX.
RECORD_SCHEMA = 4  # 3: CPU_FACTS recorded; 4: run_id, segments' CPU facts
# Every file a run's workdir holds, named once (docs/record.md, "Layout").
CHECKPOINTS = 'checkpoints'
METRICS = 'metrics.jsonl'
TENSORBOARD = 'tensorboard'
LOCK_FILE = 'run.lock'
LOG_FILE = 'train.log'
STATE_ITEM = 'state'
RESULTS_ITEM = 'results'
ITEMS = (STATE_ITEM, RESULTS_ITEM)
STATUSES = ('running', 'completed', 'failed')

# A CPU run's processor, its instruction set and XLA:CPU's (numerics/setup.py cpu_facts).
CPU_FACTS = ('cpu_model', 'cpu_isa', 'xla_cpu_isa')
# The seeds of the initial weights and of the data order (`seed` in older records).
SEED_PARTS = ('init_seed', 'data_seed')
# The replicate rule (rules.model_keys): runs of one arm equal in these are one model trained again.
MODEL_FIELDS = ('seed', *SEED_PARTS)
# Columns every run row has, in this order, before the flattened ones.
BASE_COLUMNS: tuple[str, ...] = ('run', 'run_id', 'status', 'reason', *MODEL_FIELDS)
BASE_COLUMNS += ('platform', 'device_kind', *CPU_FACTS, 'num_devices', 'num_processes')
BASE_COLUMNS += ('step', 'total_steps', 'wall_time_s')
# Parts of a record that become columns as `part.field...` (nested dicts flattened).
FLATTENED = ('final', 'numerics', 'config', 'data', 'model', 'versions')
FINAL_METRICS = ('test_accuracy', 'test_loss', 'train_loss', 'train_accuracy')
DEFAULT_METRIC = 'final.test_accuracy'

# An arm (rules.arm_columns; docs/record.md, "The rules read from it").
ARM_CONTEXT = ('platform', 'device_kind')
ARM_PREFIX = 'numerics.requested.'
ARM_NAMED = ('profile',)  # the name of a whole arithmetic: listed first
CONFIG_PREFIX = 'config.'
NOT_ARM_CONFIG = ('seed', 'init_seed', 'data_seed', 'replicate', 'numerics')
DETERMINISM_COLUMN = 'numerics.effective.gpu_deterministic'
XLA_FLAGS_COLUMN = 'numerics.effective.xla_flags'

# The test set a run was evaluated on: runs compare and pair only on one (analysis/inputs.py).
TEST_SET = ('data.source_fingerprint', 'data.split_fingerprint', 'data.test_size')
# Two runs pair by seed when these are equal: seeds, what builds the model or orders the data.
PAIRING_CONFIG = (
  'batch_size model.name model.width model.stem model.init_from model.reinit numerics.param_dtype '
  'data.name data.task data.split data.split_seed data.test_fraction data.image_size '
  'data.normalization data.flip'
).split()
PAIRING_FIELDS = (*SEED_PARTS, *(f'config.{name}' for name in PAIRING_CONFIG), *TEST_SET)

# Config fields that cannot change a run's arithmetic: not held against the same run, nor an arm.
IGNORED_FIELDS = tuple(
  'log_every_steps checkpoint_every_steps keep_checkpoints preset data.prefetch data.on_device '
  'data.manual_dir data.tfds_dir data.cache_dir distributed'.split()
)

# The dataset facts that identify a run's data (where the files live is not among them).
DATA_IDENTITY = tuple(
  'fingerprint source_fingerprint split_fingerprint image_size num_classes train_size test_size '
  'task'.split()
)
# Where a run executes: a resume on another layout changes its arithmetic (summation order).
LAYOUT = ('platform', 'device_kind', 'num_devices', 'num_processes')
SEGMENT_FACTS = LAYOUT + CPU_FACTS  # each segment: start_step, stop_step and these


class Results(TypedDict, total=False):
  """The results record as saved (docs/record.md, "Fields"); not total: older records lack some."""

  schema: int  # RECORD_SCHEMA
  run_id: str  # new_run_id, kept by every resume
  status: str  # one of STATUSES
  reason: str
  seed: int
  init_seed: int
  data_seed: int
  platform: str  # LAYOUT: where the run's last segment ran
  device_kind: str
  num_devices: int
  num_processes: int
  cpu_model: str | None  # CPU_FACTS: None on GPU and TPU
  cpu_isa: str | None
  xla_cpu_isa: str | None
  step: int
  total_steps: int
  wall_time_s: float
  failed_step: int
  numerics: dict[str, Any]  # {'requested': config.numerics, 'effective': ...}
  data: dict[str, Any]  # data_facts
  model: dict[str, Any]  # the pretrained weights' facts ({} without)
  config: dict[str, Any]  # every config field
  versions: dict[str, str]  # package -> version
  final: dict[str, float]  # FINAL_METRICS (final_metrics)
  history: list[dict[str, Any]]  # one entry per epoch
  log_sums: dict[str, float]  # training sums at the last log
  state_digest: str  # of the state saved beside the record
  segments: list[dict[str, Any]]  # steps [start_step, stop_step) on one layout


def checkpoint_dir(workdir: str) -> epath.Path:
  return epath.Path(workdir) / CHECKPOINTS


def new_record(
  config: Any,
  facts: Mapping[str, Any],
  numerics: dict[str, Any],
  data_info: Mapping[str, Any],
  model_facts: dict[str, Any],
  versions: dict[str, str],
) -> Results:
  """The record of a run about to start: status 'running', no history."""
  from configs import common

  record: dict[str, Any] = {
    'schema': RECORD_SCHEMA,
    'run_id': new_run_id(),
    'status': 'running',
    'reason': '',
    'seed': int(config.seed),
    'init_seed': common.init_seed_of(config),
    'data_seed': common.data_seed_of(config),
    **facts,
    'numerics': numerics,
    'data': dict(data_info),
    'model': model_facts,
    'config': config.to_dict(),
    'versions': versions,
    'final': {},
    'history': [],
    'wall_time_s': 0.0,
  }
  return cast(Results, record)


def new_run_id() -> str:
  """A new run's identity: 32 random hex digits (uuid4), made once, when the run starts."""
  return uuid.uuid4().hex


def run_identity(results: Mapping[str, Any]) -> str:
  """A record's run: `run_id`, or before ids 'content-' and a digest of its JSON content."""
  if results.get('run_id'):
    return str(results['run_id'])
  text = json.dumps(results, sort_keys=True, default=str)
  return 'content-' + hashlib.sha256(text.encode()).hexdigest()[:32]


def data_facts(dataset: Any) -> dict[str, Any]:
  """The record's `data` part: the dataset's facts and its number of classes."""
  return {**dataset.info, 'num_classes': int(dataset.num_classes)}


def final_metrics(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """The run's headline numbers: the last evaluation and the last epoch's training metrics."""
  evaluated = [h for h in history if 'test_accuracy' in h][-1]
  return {k: (evaluated if k.startswith('test_') else history[-1])[k] for k in FINAL_METRICS}


def save(
  mngr: Any, step: int, results: Results, state: Any = None, extra: Mapping[str, Any] | None = None
) -> None:
  """Write `results` (and `state` unless None, `extra`'s Orbax items) as step `step` of `mngr`."""
  import orbax.checkpoint as ocp

  items = {RESULTS_ITEM: ocp.args.JsonSave(copy.deepcopy(results)), **(extra or {})}
  if state is not None:
    items[STATE_ITEM] = ocp.args.StandardSave(state)
  mngr.save(step, args=ocp.args.Composite(**items), force=True)


def restore_args(abstract_state=None):
  """The Composite that reads `results` and, given its abstract structure, the state."""
  import orbax.checkpoint as ocp

  items = {RESULTS_ITEM: ocp.args.JsonRestore()}
  if abstract_state is not None:
    items[STATE_ITEM] = ocp.args.StandardRestore(abstract_state)
  return ocp.args.Composite(**items)


def read_results(run: str) -> Results | None:
  """The run's current record (its latest checkpoint step's `results`) of a run folder, or None."""
  import orbax.checkpoint as ocp

  options = ocp.CheckpointManagerOptions(read_only=True)
  with ocp.CheckpointManager(checkpoint_dir(run), item_names=ITEMS, options=options) as mngr:
    step = mngr.latest_step()
    if step is None:
      return None
    return cast(Results, dict(mngr.restore(step, args=restore_args())[RESULTS_ITEM]))


def write_results(run: str, results: Results, step: int = 0) -> None:
  """Write `results` as a results-only step of run folder `run` (tests; importing outside runs)."""
  import orbax.checkpoint as ocp

  with ocp.CheckpointManager(checkpoint_dir(run), item_names=ITEMS) as mngr:
    save(mngr, step, results)
    mngr.wait_until_finished()


def flatten(tree, prefix):
  """{'a': {'b': 1}} -> {'prefix.a.b': 1}; lists and tuples become JSON strings (hashable)."""
  out = {}
  for key, value in (tree or {}).items():
    name = f'{prefix}.{key}' if prefix else str(key)
    if isinstance(value, dict):
      out.update(flatten(value, name))
    elif isinstance(value, (list, tuple)):
      out[name] = json.dumps(list(value))
    else:
      out[name] = value
  return out


def defaults():
  """{dotted config field: default value} of every field the code has (configs/common.py)."""
  from configs import common

  return flatten(json.loads(json.dumps(common.base_config().to_dict())), '')


def upgrade_config(config: Any) -> Any:
  """A saved config dict with its numerics upgraded (numerics.formats.upgrade); a new dict."""
  if isinstance(config, dict) and 'numerics' in config:
    return {**config, 'numerics': formats.upgrade(config['numerics'])}
  return config


def upgrade(results: Mapping[str, Any]) -> Results:
  """A saved record as today's fields: its numerics and config's numerics upgraded; a new dict."""
  out = dict(results)
  if isinstance(out.get('numerics'), dict):
    out['numerics'] = {
      part: formats.upgrade(value) if isinstance(value, dict) else value
      for part, value in out['numerics'].items()
    }
  if 'config' in out:
    out['config'] = upgrade_config(out['config'])
  return cast(Results, out)


def within(name: str, fields: Iterable[str]) -> bool:
  """Whether dotted field `name` is one of `fields` or inside one of them."""
  return any(name == f or name.startswith(f + '.') for f in fields)


PREDICTIONS_ITEM = 'predictions'
PREDICTION_KEYS = {
  'classification': ('label', 'predicted', 'p_predicted', 'p_label'),
  'multilabel': ('label', 'predicted', 'probability'),
}


def collect_predictions(dataset, outputs):
  """The predictions item of one evaluation of `dataset`'s test split from the eval outputs."""
  n, task = len(dataset.test), dataset.task
  arrays = {key: np.concatenate([o[key] for o in outputs])[:n] for key in outputs[0]}
  arrays['label'] = np.asarray(dataset.test.labels)
  labels = np.int32 if task == 'classification' else np.int8  # multilabel: bits
  item = {
    key: arrays[key].astype(labels if key in ('label', 'predicted') else np.float32)
    for key in PREDICTION_KEYS[task]
  }
  return {**item, 'task': task, 'fingerprint': str(dataset.info.get('split_fingerprint', ''))}


def predictions_save_args(predictions):
  """{item name: Orbax save argument} for `save`: nothing when None."""
  import orbax.checkpoint as ocp  # loads JAX: not at import

  return {} if predictions is None else {PREDICTIONS_ITEM: ocp.args.PyTreeSave(predictions)}


def saved_steps(workdir):
  """The checkpoint steps of `workdir` that hold a predictions item, oldest first."""
  folder = checkpoint_dir(workdir)
  if not folder.exists():
    return []
  return sorted(
    int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / PREDICTIONS_ITEM).exists()
  )


def read_predictions(workdir, step=None):
  """The predictions (with task, fingerprint, step) at `step` of `workdir` (None: newest)."""
  workdir = workdir if '://' in str(workdir) else os.path.abspath(workdir)  # Orbax: absolute
  steps = saved_steps(workdir)
  if step is None:
    step = steps[-1] if steps else None
  if step not in steps:
    return None
  import orbax.checkpoint as ocp

  options = ocp.CheckpointManagerOptions(read_only=True)
  with (
    orbax_warnings_off(),
    ocp.CheckpointManager(
      checkpoint_dir(workdir), item_names=(PREDICTIONS_ITEM,), options=options
    ) as mngr,
  ):  # Orbax warns three lines per read-only manager
    restored = mngr.restore(
      step, args=ocp.args.Composite(**{PREDICTIONS_ITEM: ocp.args.PyTreeRestore()})
    )
  return {**dict(restored[PREDICTIONS_ITEM]), 'step': int(step)}


@contextlib.contextmanager
def orbax_warnings_off():
  """Orbax's absl warnings kept off stderr while inside (its errors still shown)."""
  absl_log = logging.getLogger('absl')
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    yield
  finally:
    absl_log.setLevel(level)
