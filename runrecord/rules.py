"""The rules read from results records: one row per run, an arm's columns, pairing, the replicate
rule, the platform a run counts as, the same run (what a resume or the sweep compares), segments."""

import json
from collections.abc import Iterable, Mapping
from typing import Any

from runrecord import record
from runrecord.record import Results


def row(run: str, results: Results | None) -> dict[str, Any]:
  """One row of the runs table from run folder `run`'s record (None: nothing saved yet)."""
  if results is None:
    return {'run': run, 'status': 'no_results', 'reason': 'no saved checkpoint step'}
  results = record.upgrade(results)
  out = {name: results.get(name) for name in record.BASE_COLUMNS[1:]}
  out.update(run=run, run_id=record.run_identity(results), platform=platform_identity(results))
  segments = [s for s in results.get('segments') or [] if isinstance(s, dict)]
  kinds = list(dict.fromkeys(s['device_kind'] for s in segments if s.get('device_kind')))
  if len(kinds) > 1:  # trained on several device kinds (--allow_layout_change): none of them alone
    out['device_kind'] = '+'.join(map(str, kinds))
  if out['seed'] is None:
    out['seed'] = (results.get('config') or {}).get('seed')
  for name in record.SEED_PARTS:
    out[name] = out['seed'] if out[name] is None else out[name]
  for part in record.FLATTENED:
    out.update(record.flatten(results.get(part), part))
  if out.get('status') in record.STATUSES:
    for name, value in record.defaults().items():
      if name.startswith('numerics.'):
        out.setdefault(f'{record.ARM_PREFIX}{name[len("numerics.") :]}', value)
      if results.get('config') and name != 'seed':
        out.setdefault(f'{record.CONFIG_PREFIX}{name}', value)
  return out


def arm_columns(frame: Any) -> list[str]:
  """The columns of runs table `frame` that define an arm: platform, device kind, the requested
  numerics (named ones first), and the config fields that differ between runs (seeds aside)."""
  columns = list(frame.columns)
  named = [c for c in (record.ARM_PREFIX + n for n in record.ARM_NAMED) if c in columns]
  fixed = record.NOT_ARM_CONFIG + record.IGNORED_FIELDS  # config fields that never make an arm
  config = [c for c in sorted(columns) if c.startswith(record.CONFIG_PREFIX)]
  config = [c for c in config if not record.within(field_name(c), fixed) and frame[c].nunique() > 1]
  return (
    [c for c in record.ARM_CONTEXT if c in columns]
    + named
    + sorted(c for c in columns if c.startswith(record.ARM_PREFIX) and c not in named)
    + config
  )


def field_name(column: str) -> str:
  """How an arm label names a column: 'optim.learning_rate' for a config column, else its end."""
  if column.startswith(record.CONFIG_PREFIX):
    return column[len(record.CONFIG_PREFIX) :]
  return column.rsplit('.', 1)[-1]


def model_keys(
  seeds: Iterable[Any],
  init_seeds: Iterable[Any] | None = None,
  data_seeds: Iterable[Any] | None = None,
) -> list[Any]:
  """Each run's model within its arm (the replicate rule): its seed, or 'S (init I, data D)' where
  any run's init or data seed differs from its seed."""

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


def pairing_columns(columns: Iterable[str]) -> list[str]:
  """record.PAIRING_FIELDS present among `columns`."""
  return [c for c in record.PAIRING_FIELDS if c in set(columns)]


def platform_identity(results: Mapping[str, Any]) -> str | None:
  """The platform a record ran on, as the analysis tells them apart: the JAX platform, on CPU with
  its instruction set ('cpu-AVX2') and XLA's where a pin lowered it ('cpu-AVX512-max-AVX2')."""
  segments = [s for s in results.get('segments') or [] if isinstance(s, dict)]
  if segments:  # each segment's facts, over the record's where a segment predates them
    top = {k: results.get(k) for k in record.SEGMENT_FACTS}
    merged = [{**top, **{k: v for k, v in s.items() if v is not None}} for s in segments]
    names = list(dict.fromkeys(map(platform_identity, merged)))
    if len(names) > 1:
      return '+'.join(str(n) for n in names)
  platform = results.get('platform')
  _, isa, xla_isa = (results.get(k) for k in record.CPU_FACTS)
  if platform != 'cpu' or not isa:
    return platform
  return f'{platform}-{isa}' + (f'-max-{xla_isa}' if xla_isa and xla_isa != isa else '')


def jax_platform(identity: str) -> str:
  """The JAX platform ('cpu', 'gpu', 'tpu') of a platform identity ('cpu-AVX2')."""
  return str(identity).split('-', 1)[0]


def data_differences(
  saved: Mapping[str, Any] | None, current: Mapping[str, Any] | None
) -> list[str]:
  """['data.field: saved -> current', ...] over the record.DATA_IDENTITY fields both dicts hold."""
  saved, current = saved or {}, current or {}
  return [
    f'data.{k}: {saved[k]!r} -> {current[k]!r}'
    for k in record.DATA_IDENTITY
    if k in saved and k in current and saved[k] != current[k]
  ]


def layout_differences(saved: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
  """['num_devices: 8 -> 4', ...]: how layout `facts` differs from the saved record's."""
  return [
    f'{k}: {saved.get(k)!r} -> {facts[k]!r}'
    for k in record.LAYOUT
    if saved.get(k) is not None and saved.get(k) != facts[k]
  ]


def identity_differences(saved: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
  """['platform identity: before -> now'] where this session's differs from the saved one."""
  before, now = (platform_identity({**saved, 'segments': None}), platform_identity(facts))
  if saved.get('platform') != facts.get('platform') or before in (None, now, saved.get('platform')):
    return []  # another platform altogether: LAYOUT's 'platform' line says so
  return [f'platform identity: {before} -> {now}']


def start_segment(
  results: Results, saved: Mapping[str, Any] | None, facts: Mapping[str, Any], step: int
) -> None:
  """results['segments']: the saved ones up to `step`, then this session's (merged: one layout)."""
  saved = saved or {}
  if saved.get('run_id'):
    results['run_id'] = saved['run_id']  # a resume continues the run: its identity too
  old = saved.get('segments') or (
    [{'start_step': 0, 'stop_step': step, **{k: saved.get(k) for k in record.LAYOUT}}]
    if step
    else []
  )
  segments = [dict(s) for s in old if s['start_step'] < step]
  if segments:
    segments[-1]['stop_step'] = min(segments[-1]['stop_step'], step)
  layout = {
    k: facts.get(k) for k in record.SEGMENT_FACTS if k in record.LAYOUT or facts.get(k) is not None
  }
  if not (segments and {k: segments[-1].get(k, v) for k, v in layout.items()} == layout):
    segments.append({'start_step': step, 'stop_step': step, **layout})
  results['segments'] = segments  # the saved ones, then `layout`'s


def end_segment(results: Results, step: int) -> None:
  """The current segment reaches `step` (called at every save)."""
  results['segments'][-1]['stop_step'] = step


def config_differences(
  saved: Mapping[str, Any] | None, requested: Mapping[str, Any] | None
) -> list[str]:
  """['field: saved -> requested', ...] of two configs not the same run (IGNORED_FIELDS aside)."""
  old = record.flatten(json.loads(json.dumps(record.upgrade_config(saved or {}))), '')
  new = record.flatten(json.loads(json.dumps(requested or {})), '')
  default = record.defaults()
  for name in set(new) - set(old):
    if name in default:
      old[name] = default[name]
  return [
    f'{k}: {old.get(k, "<absent>")!r} -> {new.get(k, "<absent>")!r}'
    for k in sorted(set(old) | set(new))
    if not record.within(k, record.IGNORED_FIELDS) and old.get(k) != new.get(k)
  ]
