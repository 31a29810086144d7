"""A run's sessions in its results record: what a resumed session (or the sweep) compares against
the saved record, the same run rule (the same config, data, layout and platform identity:
`config_differences`, `data_differences`, `layout_differences`, `identity_differences`), and the
segments of steps each layout trained (`start_segment`, `end_segment`). The fields are
runrecord/record.py's; docs/record.md ("Fields": `segments`; "The rules read from it").
"""

import json
from collections.abc import Mapping
from typing import Any, cast

from runrecord import record, rules
from runrecord.record import Results, Segment


def data_differences(
  saved: Mapping[str, Any] | None, current: Mapping[str, Any] | None
) -> list[str]:
  """['data.field: saved -> current', ...] over the record.DATA_IDENTITY fields both `data` dicts
  hold."""
  saved, current = saved or {}, current or {}
  return [
    f'data.{k}: {saved[k]!r} -> {current[k]!r}'
    for k in record.DATA_IDENTITY
    if k in saved and k in current and saved[k] != current[k]
  ]


def layout_differences(saved: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
  """['num_devices: 8 -> 4', ...]: how the layout `facts` differs from the saved record's (the
  platform identity apart: identity_differences)."""
  return [
    f'{k}: {saved.get(k)!r} -> {facts[k]!r}'
    for k in record.LAYOUT
    if saved.get(k) is not None and saved.get(k) != facts[k]
  ]


def identity_differences(saved: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
  """['platform identity: cpu-AVX512 -> cpu-AVX2'] when the platform identity of `facts` (this
  session) differs from the one the saved record's last segment ran on, else [] (a record whose
  identity is not recorded, 'cpu' before schema 3, is not held against a session)."""
  before, now = (
    rules.platform_identity({**saved, 'segments': None}),
    rules.platform_identity(facts),
  )
  if saved.get('platform') != facts.get('platform') or before in (None, now, saved.get('platform')):
    return []  # another platform altogether: LAYOUT's 'platform' line says so
  return [f'platform identity: {before} -> {now}']


def start_segment(
  results: Results, saved: Mapping[str, Any] | None, facts: Mapping[str, Any], step: int
) -> None:
  """results['segments']: the saved record's segments up to `step` (a record written before
  segments existed: one segment on its own layout), then this session's, from `step` on `facts`'s
  layout, merged into the last one when that has the same layout."""
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
  results['segments'] = cast(list[Segment], segments)  # each a Segment: the saved ones, `layout`


def end_segment(results: Results, step: int) -> None:
  """The current segment reaches `step` (called at every save)."""
  results['segments'][-1]['stop_step'] = step


def config_differences(
  saved: Mapping[str, Any] | None, requested: Mapping[str, Any] | None
) -> list[str]:
  """['field: saved -> requested', ...]: the fields in which config dict `requested` is not the
  same run as saved config dict `saved` (record.IGNORED_FIELDS aside; a field the saved config
  predates counts as its default). Empty: the same run."""
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
