"""The results record, one owner: its fields (`Results`, `new_record`), the columns and field lists
the rules read (runrecord/rules.py), the workdir's file names, Orbax I/O, older records' upgrade."""

import copy
import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, cast

from etils import epath

from numerics import formats

# Orbax (it loads JAX) is imported inside the functions that use it: the analysis of a CSV reads
# only this module's field names and stays without JAX (~170 MB, seconds).

RECORD_SCHEMA = 4  # 3: CPU_FACTS recorded; 4: run_id, segments' CPU facts
# Every file a run's workdir holds, named once (the trainer writes them, the sweep and the analysis
# read them): the checkpoints folder, the JSON-lines metrics, the lock, the sweep's log of a run.
CHECKPOINTS = 'checkpoints'
METRICS = 'metrics.jsonl'
TENSORBOARD = 'tensorboard'
LOCK_FILE = 'run.lock'
LOG_FILE = 'train.log'
STATE_ITEM = 'state'
RESULTS_ITEM = 'results'
ITEMS = (STATE_ITEM, RESULTS_ITEM)
STATUSES = ('running', 'completed', 'failed')

# A CPU run's processor: its model name, its instruction set and the one XLA:CPU generated code for
# (XLA's names of the levels, 'AVX2', 'AVX512', ...; the architecture off x86-64): cpu_facts in
# numerics/setup.py.
CPU_FACTS = ('cpu_model', 'cpu_isa', 'xla_cpu_isa')
# The seeds a run's initial weights and data order came from (configs/common.py init_seed_of,
# data_seed_of): `seed` in records written before they existed.
SEED_PARTS = ('init_seed', 'data_seed')
# Two runs of one arm are the same model trained again (replicates: averaged as one value, their
# spread the nondeterminism) only when these are equal (the replicate rule: rules.model_keys).
# `replicate` is not among them: it only names a repeated run.
MODEL_FIELDS = ('seed', *SEED_PARTS)
# Columns every run row has, in this order, before the flattened ones.
BASE_COLUMNS: tuple[str, ...] = ('run', 'run_id', 'status', 'reason', *MODEL_FIELDS)
BASE_COLUMNS += ('platform', 'device_kind', *CPU_FACTS, 'num_devices', 'num_processes')
BASE_COLUMNS += ('step', 'total_steps', 'wall_time_s')
# Parts of a record that become columns as `part.field...` (nested dicts flattened).
FLATTENED = ('final', 'numerics', 'config', 'data', 'model', 'versions')
FINAL_METRICS = ('test_accuracy', 'test_loss', 'train_loss', 'train_accuracy')
DEFAULT_METRIC = 'final.test_accuracy'

# An arm: runs equal in these columns, in every requested numerics field and in every config field
# that differs between the runs, but the fields that cannot change the result (IGNORED_FIELDS), the
# seed (an arm's replicate index) and config.numerics (the numerics.requested.* columns).
ARM_CONTEXT = ('platform', 'device_kind')
ARM_PREFIX = 'numerics.requested.'
ARM_NAMED = ('profile',)  # the name of a whole arithmetic: listed first
CONFIG_PREFIX = 'config.'
NOT_ARM_CONFIG = ('seed', 'init_seed', 'data_seed', 'replicate', 'numerics')
# Whether a GPU run used deterministic kernels (TPU and CPU runs repeat bit for bit anyway).
DETERMINISM_COLUMN = 'numerics.effective.gpu_deterministic'
# The XLA flags in effect (XLA_FLAGS as the run started, numerics/setup.py describe).
XLA_FLAGS_COLUMN = 'numerics.effective.xla_flags'

# The test set a run was evaluated on, as the datasets record it (input_pipeline: digits and
# CelebA record the test split's fingerprint and size, CelebA the source files' fingerprint too):
# runs compare example by example, and pair, only on one test set (analysis/inputs.py).
TEST_SET = ('data.source_fingerprint', 'data.split_fingerprint', 'data.test_size')
# Two runs share initial weights and data order (and so pair by seed) when these are equal:
# the init and data seeds (both `seed` unless set apart), everything that builds the initial
# model or orders and transforms the data, and the test set they were evaluated on.
PAIRING_CONFIG = (
  'batch_size model.name model.width model.stem model.init_from model.reinit numerics.param_dtype '
  'data.name data.task data.split data.split_seed data.test_fraction data.image_size '
  'data.normalization data.flip'
).split()
PAIRING_FIELDS = (*SEED_PARTS, *(f'config.{name}' for name in PAIRING_CONFIG), *TEST_SET)

# Config fields that cannot change a run's arithmetic: a saved run with other values of these is
# still the same run (resume continues it, the sweep counts it as done). Everything else (seed,
# epochs, batch sizes, eval_every_epochs, numerics, optimizer, model, data) must match.
IGNORED_FIELDS = tuple(
  'log_every_steps checkpoint_every_steps keep_checkpoints preset data.prefetch data.on_device '
  'data.manual_dir data.tfds_dir data.cache_dir distributed'.split()
)

# The dataset facts that identify the data a run trains on (present in `data` when the dataset
# reports them): the files, the split, the resolution and the number of classes. Where the files
# live (paths, the decoded cache's folder) is not part of the data's identity.
DATA_IDENTITY = tuple(
  'fingerprint source_fingerprint split_fingerprint image_size num_classes train_size test_size '
  'task'.split()
)
# Where a run executes: a resume on another layout changes the run's arithmetic (summation order).
LAYOUT = ('platform', 'device_kind', 'num_devices', 'num_processes')
# What each segment records: its layout and, on CPU, the processor (its platform identity).
SEGMENT_FACTS = LAYOUT + CPU_FACTS


class Segment(TypedDict, total=False):
  """Steps [start_step, stop_step) a run trained on one device layout: its LAYOUT and CPU_FACTS."""

  start_step: int
  stop_step: int
  platform: str
  device_kind: str
  num_devices: int
  num_processes: int
  cpu_model: str | None
  cpu_isa: str | None
  xla_cpu_isa: str | None


class Results(TypedDict, total=False):
  """The results record as saved: docs/record.md ("Fields"). Not total: older records lack
  fields."""

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
  segments: list[Segment]


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
  """What tells two records of one run from two runs' records: `run_id`, or for a record from before
  ids, 'content-' and a digest of its JSON content."""
  if results.get('run_id'):
    return str(results['run_id'])
  text = json.dumps(results, sort_keys=True, default=str)
  return 'content-' + hashlib.sha256(text.encode()).hexdigest()[:32]


def data_facts(dataset: Any) -> dict[str, Any]:
  """The record's `data` part: the dataset's facts and its number of classes."""
  return {**dataset.info, 'num_classes': int(dataset.num_classes)}


def final_metrics(history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """The run's headline numbers: the last evaluation and the last epoch's training metrics."""
  evaluated = [h for h in history if 'test_accuracy' in h]
  last = history[-1]
  return {
    'test_accuracy': evaluated[-1]['test_accuracy'],
    'test_loss': evaluated[-1]['test_loss'],
    'train_loss': last['train_loss'],
    'train_accuracy': last['train_accuracy'],
  }


def save(
  mngr: Any, step: int, results: Results, state: Any = None, extra: Mapping[str, Any] | None = None
) -> None:
  """Write `results` (and `state`, `extra`'s items) as step `step` of the Orbax manager `mngr`."""
  mngr.save(step, args=save_args(copy.deepcopy(results), state, extra), force=True)


def save_args(results: Results, state: Any = None, extra: Mapping[str, Any] | None = None) -> Any:
  """The Orbax Composite of `results` (JSON), `state` unless None, and `extra`'s items."""
  import orbax.checkpoint as ocp

  items = {RESULTS_ITEM: ocp.args.JsonSave(results), **(extra or {})}
  if state is not None:
    items[STATE_ITEM] = ocp.args.StandardSave(state)
  return ocp.args.Composite(**items)


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
