"""The results record, one owner: its fields and the table columns they become (new_record, row),
its place in the Orbax checkpoint, the workdir's file names, the upgrade of older records, and the
rules read from it: the arm (arm_columns), the pair (PAIRING_FIELDS), the replicate (model_keys),
one run (run_identity), the same run (config_differences, data_differences, layout_differences)
and the platform (platform_identity). What each field and rule means: docs/record.md.
"""

import copy
import hashlib
import json
import uuid

from etils import epath

# Orbax and numerics.profiles (both load JAX) are imported inside the functions that use them: the
# analysis of a CSV reads only this module's field names and stays without JAX (~170 MB, seconds).

RECORD_SCHEMA = 4  # 3: CPU_FACTS recorded; 4: run_id, segments' CPU facts
# Every file a run's workdir holds, named once (the trainer writes them, the sweep and the analysis
# read them): the checkpoints folder, the JSON-lines metrics, the lock, the sweep's log of a run.
CHECKPOINTS = 'checkpoints'
METRICS = 'metrics.jsonl'
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
# Columns every run row has, in this order, before the flattened ones.
BASE_COLUMNS = (
  'run',
  'run_id',
  'status',
  'reason',
  'seed',
  'init_seed',
  'data_seed',
  'platform',
  'device_kind',
  *CPU_FACTS,
  'num_devices',
  'num_processes',
  'step',
  'total_steps',
  'wall_time_s',
)
# The seeds a run's initial weights and data order came from (configs/common.py init_seed_of,
# data_seed_of): `seed` in records written before they existed.
SEED_PARTS = ('init_seed', 'data_seed')
# Two runs of one arm are the same model trained again (replicates: averaged as one value, their
# spread the nondeterminism) only when these are equal; otherwise they are different models (the
# replicate rule: `model_keys`, which every reader that averages replicates or pairs arms by seed
# uses). `replicate` is not among them: it only names a repeated run.
MODEL_FIELDS = ('seed', *SEED_PARTS)
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
# runs compare example by example, and pair, only on one test set (analysis/inputs/columns.py).
TEST_SET = ('data.source_fingerprint', 'data.split_fingerprint', 'data.test_size')
# Two runs share initial weights and data order (and so pair by seed) when these are equal:
# the init and data seeds (both `seed` unless set apart), everything that builds the initial
# model or orders and transforms the data, and the test set they were evaluated on.
PAIRING_FIELDS = (
  'init_seed',
  'data_seed',
  'config.batch_size',
  'config.model.name',
  'config.model.width',
  'config.model.stem',
  'config.model.init_from',
  'config.model.reinit',
  'config.numerics.param_dtype',
  'config.data.name',
  'config.data.task',
  'config.data.split',
  'config.data.split_seed',
  'config.data.test_fraction',
  'config.data.image_size',
  'config.data.normalization',
  'config.data.flip',
  *TEST_SET,
)

# Config fields that cannot change a run's arithmetic: a saved run with other values of these is
# still the same run (resume continues it, the sweep counts it as done). Everything else (seed,
# epochs, batch sizes, eval_every_epochs, numerics, optimizer, model, data) must match.
IGNORED_FIELDS = (
  'log_every_steps',
  'checkpoint_every_steps',
  'keep_checkpoints',
  'preset',
  'data.prefetch',
  'data.on_device',
  'data.manual_dir',
  'data.tfds_dir',
  'data.cache_dir',
  'distributed',
)


# The dataset facts that identify the data a run trains on (present in `data` when the dataset
# reports them): the files, the split, the resolution and the number of classes. Where the files
# live (paths, the decoded cache's folder) is not part of the data's identity.
DATA_IDENTITY = (
  'fingerprint',
  'source_fingerprint',
  'split_fingerprint',
  'image_size',
  'num_classes',
  'train_size',
  'test_size',
  'task',
)
# Where a run executes: a resume on another layout changes the run's arithmetic (summation order).
LAYOUT = ('platform', 'device_kind', 'num_devices', 'num_processes')
# What each segment records: its layout and, on CPU, the processor (its platform identity).
SEGMENT_FACTS = LAYOUT + CPU_FACTS


def checkpoint_dir(workdir):
  return epath.Path(workdir) / CHECKPOINTS


def new_record(config, facts, numerics, data_info, model_facts, versions):
  """The record of a run about to start: status 'running', no history.

  `facts`: {'platform', 'device_kind', 'num_devices', 'num_processes'} of this run's devices.
  """
  from configs import common

  return {
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


def new_run_id():
  """A new run's identity: 32 random hex digits (uuid4), made once, when the run starts."""
  return uuid.uuid4().hex


def run_identity(results):
  """What tells two records of one run from records of two runs: the recorded `run_id`; for a
  record written before ids existed, 'content-' and a digest of its whole JSON content (a copy is
  the same run; distinct runs differ at least in wall time and history)."""
  if results.get('run_id'):
    return str(results['run_id'])
  text = json.dumps(results, sort_keys=True, default=str)
  return 'content-' + hashlib.sha256(text.encode()).hexdigest()[:32]


def data_facts(dataset):
  """The record's `data` part: the dataset's facts and its number of classes."""
  return {**dataset.info, 'num_classes': int(dataset.num_classes)}


def data_differences(saved, current):
  """['data.field: saved -> current', ...] over DATA_IDENTITY fields both `data` dicts hold."""
  saved, current = saved or {}, current or {}
  return [
    f'data.{k}: {saved[k]!r} -> {current[k]!r}'
    for k in DATA_IDENTITY
    if k in saved and k in current and saved[k] != current[k]
  ]


def layout_differences(saved, facts):
  """['num_devices: 8 -> 4', ...]: how the layout `facts` differs from the saved record's (the
  platform identity apart: identity_differences)."""
  return [
    f'{k}: {saved.get(k)!r} -> {facts[k]!r}'
    for k in LAYOUT
    if saved.get(k) is not None and saved.get(k) != facts[k]
  ]


def identity_differences(saved, facts):
  """['platform identity: cpu-AVX512 -> cpu-AVX2'] when the platform identity of `facts` (this
  session) differs from the one the saved record's last segment ran on, else [] (a record whose
  identity is not recorded, 'cpu' before schema 3, is not held against a session)."""
  before, now = platform_identity({**saved, 'segments': None}), platform_identity(facts)
  if saved.get('platform') != facts.get('platform') or before in (None, now, saved.get('platform')):
    return []  # another platform altogether: LAYOUT's 'platform' line says so
  return [f'platform identity: {before} -> {now}']


def start_segment(results, saved, facts, step):
  """results['segments']: the saved record's segments up to `step` (a record written before
  segments existed: one segment on its own layout), then this session's, from `step` on `facts`'s
  layout, merged into the last one when that has the same layout."""
  saved = saved or {}
  if saved.get('run_id'):
    results['run_id'] = saved['run_id']  # a resume continues the run: its identity too
  old = saved.get('segments') or (
    [{'start_step': 0, 'stop_step': step, **{k: saved.get(k) for k in LAYOUT}}] if step else []
  )
  segments = [dict(s) for s in old if s['start_step'] < step]
  if segments:
    segments[-1]['stop_step'] = min(segments[-1]['stop_step'], step)
  layout = {k: facts.get(k) for k in SEGMENT_FACTS if k in LAYOUT or facts.get(k) is not None}
  if not (segments and {k: segments[-1].get(k, v) for k, v in layout.items()} == layout):
    segments.append({'start_step': step, 'stop_step': step, **layout})
  results['segments'] = segments


def end_segment(results, step):
  """The current segment reaches `step` (called at every save)."""
  results['segments'][-1]['stop_step'] = step


def final_metrics(history):
  """The run's headline numbers: the last evaluation and the last epoch's training metrics."""
  evaluated = [h for h in history if 'test_accuracy' in h]
  last = history[-1]
  return {
    'test_accuracy': evaluated[-1]['test_accuracy'],
    'test_loss': evaluated[-1]['test_loss'],
    'train_loss': last['train_loss'],
    'train_accuracy': last['train_accuracy'],
  }


def save(mngr, step, results, state=None, extra=None):
  """Write the record `results` (and, unless None, `state`) as step `step` of the Orbax manager
  `mngr`: <workdir>/checkpoints/<step>/{results, state}, asynchronously where `mngr` is. The
  results are deep-copied: the caller keeps appending to its dict while the write runs.
  `extra`: further items of the step, {name: Orbax save argument} (runrecord/predictions.py)."""
  mngr.save(step, args=save_args(copy.deepcopy(results), state, extra), force=True)


def save_args(results, state=None, extra=None):
  """The Orbax Composite that writes `results` (JSON), unless None `state`, and `extra`'s items
  at one step."""
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


def read_results(run):
  """The run's current record: its latest checkpoint step's `results` item.

  Args:
    run: a run folder (its --workdir), local or gs://.

  Returns:
    The record as saved (a dict, docs/record.md "Fields"; `upgrade` maps an old one), or None
    when the run has no saved step yet.

  Raises:
    Orbax's and TensorStore's errors for an unreadable step (analysis/inputs/results.py turns them
    into an excluded run with its reason).
  """
  import orbax.checkpoint as ocp

  options = ocp.CheckpointManagerOptions(read_only=True)
  with ocp.CheckpointManager(checkpoint_dir(run), item_names=ITEMS, options=options) as mngr:
    step = mngr.latest_step()
    if step is None:
      return None
    return dict(mngr.restore(step, args=restore_args())[RESULTS_ITEM])


def write_results(run, results, step=0):
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


def _upgrade_config(config):
  """A saved config (dict) with its numerics through numerics.profiles.upgrade, as a new dict;
  anything without numerics comes back as it is."""
  from numerics import profiles

  if isinstance(config, dict) and 'numerics' in config:
    return {**config, 'numerics': profiles.upgrade(config['numerics'])}
  return config


def upgrade(results):
  """A saved record (dict) as today's fields: its requested and effective numerics and its
  config's numerics through numerics.profiles.upgrade (the removed `emulate` shorthand); a new
  dict."""
  from numerics import profiles

  results = dict(results)
  if isinstance(results.get('numerics'), dict):
    results['numerics'] = {
      part: profiles.upgrade(value) if isinstance(value, dict) else value
      for part, value in results['numerics'].items()
    }
  if 'config' in results:
    results['config'] = _upgrade_config(results['config'])
  return results


def platform_identity(results):
  """The platform record `results` ran on, as the analysis tells platforms apart (module doc): the
  JAX platform, on CPU followed by the processor's instruction set ('cpu-AVX2') and by XLA's where
  a pin lowered it ('cpu-AVX512-max-AVX2'); the bare platform where the instruction set is not
  recorded (records before schema 3) and on GPU and TPU."""
  segments = [s for s in results.get('segments') or [] if isinstance(s, dict)]
  if segments:  # each segment's facts, over the record's where a segment predates them
    top = {k: results.get(k) for k in SEGMENT_FACTS}
    names = list(
      dict.fromkeys(
        platform_identity({**top, **{k: v for k, v in s.items() if v is not None}})
        for s in segments
      )
    )
    if len(names) > 1:
      return '+'.join(str(n) for n in names)
  platform = results.get('platform')
  _, isa, xla_isa = (results.get(k) for k in CPU_FACTS)
  if platform != 'cpu' or not isa:
    return platform
  return f'{platform}-{isa}' + (f'-max-{xla_isa}' if xla_isa and xla_isa != isa else '')


def jax_platform(identity):
  """The JAX platform ('cpu', 'gpu', 'tpu') of a platform identity ('cpu-AVX2', platform_identity):
  what a rule declared per JAX platform (an emulating profile, determinism) reads."""
  return str(identity).split('-', 1)[0]


def row(run, results):
  """One row of the runs table from a run's record.

  Args:
    run: the run's folder, its `run` column.
    results: its record (read_results), or None when nothing is saved yet.

  Returns:
    A dict: BASE_COLUMNS (run_id by run_identity, platform by platform_identity, init and data
    seeds `seed` where not set apart) and the flattened parts (`final.*`, `numerics.*`,
    `config.*`, ...); requested numerics fields the record predates, and config fields but the
    seed, filled with their defaults (docs/record.md "Fields"). Without a record: status
    'no_results' and its reason.
  """
  if results is None:
    return {'run': run, 'status': 'no_results', 'reason': 'no saved checkpoint step'}
  results = upgrade(results)
  out = {name: results.get(name) for name in BASE_COLUMNS[1:]}
  out.update(run=run, run_id=run_identity(results), platform=platform_identity(results))
  kinds = list(
    dict.fromkeys(
      s.get('device_kind')
      for s in results.get('segments') or []
      if isinstance(s, dict) and s.get('device_kind')
    )
  )
  if len(kinds) > 1:  # trained on several device kinds (--allow_layout_change): none of them alone
    out['device_kind'] = '+'.join(map(str, kinds))
  if out['seed'] is None:
    out['seed'] = (results.get('config') or {}).get('seed')
  for name in SEED_PARTS:
    out[name] = out['seed'] if out[name] is None else out[name]
  for part in FLATTENED:
    out.update(flatten(results.get(part), part))
  if out.get('status') in STATUSES:
    for name, value in defaults().items():
      if name.startswith('numerics.'):
        out.setdefault(f'{ARM_PREFIX}{name[len("numerics.") :]}', value)
      if results.get('config') and name != 'seed':
        out.setdefault(f'{CONFIG_PREFIX}{name}', value)
  return out


def _arm_config(column):
  """Whether config column `column` can define an arm (not in NOT_ARM_CONFIG or IGNORED_FIELDS)."""
  return not _under(column[len(CONFIG_PREFIX) :], NOT_ARM_CONFIG + IGNORED_FIELDS)


def arm_columns(frame):
  """The columns of runs table `frame` that define an arm: platform, device kind, every requested
  numerics field (the named ones first, ARM_NAMED: a label then reads 'profile=tpu_default', not
  the formats the profile expands to), then every config field whose recorded values differ
  between the runs (missing values aside), the seed, config.numerics and IGNORED_FIELDS aside."""
  columns = list(frame.columns)
  named = [f'{ARM_PREFIX}{n}' for n in ARM_NAMED if f'{ARM_PREFIX}{n}' in columns]
  config = [
    c
    for c in sorted(columns)
    if c.startswith(CONFIG_PREFIX) and _arm_config(c) and frame[c].nunique() > 1
  ]
  return (
    [c for c in ARM_CONTEXT if c in columns]
    + named
    + sorted(c for c in columns if c.startswith(ARM_PREFIX) and c not in named)
    + config
  )


def field_name(column):
  """How an arm label names a column: 'optim.learning_rate' for config.optim.learning_rate (the
  spelling of a config override), the last part otherwise ('profile', 'compute_dtype')."""
  if column.startswith(CONFIG_PREFIX):
    return column[len(CONFIG_PREFIX) :]
  return column.rsplit('.', 1)[-1]


def model_keys(seeds, init_seeds=None, data_seeds=None):
  """Each run's model within its arm, the unit replicates are averaged in and arms are paired by
  (the replicate rule, MODEL_FIELDS): the seed itself where every run's init and data-order seeds
  equal its seed or are not recorded (older records, a CSV without them), else for every run
  'S (init I, data D)': runs of one seed with other initial weights or data order are never
  replicates. A list aligned with `seeds`; None where the seed is."""

  def text(v):
    if v is None or v != v:  # absent or NaN (a CSV's empty cell)
      return None
    return str(int(v)) if isinstance(v, float) else str(v)

  seeds = list(seeds)
  parts = [list(p) if p is not None else [None] * len(seeds) for p in (init_seeds, data_seeds)]
  rows = list(zip(*([text(v) for v in column] for column in (seeds, *parts)), strict=True))
  if not any(t is not None and t != s for s, *rest in rows for t in rest):
    return seeds
  return [None if s is None else f'{s} (init {i or s}, data {d or s})' for s, i, d in rows]


def pairing_columns(columns):
  """PAIRING_FIELDS present among `columns` (a CSV has none: its rows never pair by these)."""
  return [c for c in PAIRING_FIELDS if c in set(columns)]


def _under(name, fields):
  """Whether dotted field `name` is one of `fields` or inside one of them."""
  return any(name == f or name.startswith(f + '.') for f in fields)


def config_differences(saved, requested):
  """['field: saved -> requested', ...]: the fields in which config dict `requested` is not the
  same run as saved config dict `saved` (IGNORED_FIELDS aside; a field the saved config predates
  counts as its default). Empty: the same run."""
  old = flatten(json.loads(json.dumps(_upgrade_config(saved or {}))), '')
  new = flatten(json.loads(json.dumps(requested or {})), '')
  default = defaults()
  for name in set(new) - set(old):
    if name in default:
      old[name] = default[name]
  return [
    f'{k}: {old.get(k, "<absent>")!r} -> {new.get(k, "<absent>")!r}'
    for k in sorted(set(old) | set(new))
    if not _under(k, IGNORED_FIELDS) and old.get(k) != new.get(k)
  ]
