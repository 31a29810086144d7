"""The analysis result, typed: what analysis.numbers.stats, analysis.numbers.attribution,
analysis.numbers.answer and analysis.numbers.agreement_section hand on to the words (report,
summary, findings) and the figures.

One owner for the result's shape: every reader takes these fields by name (`result.arms`); a
field that is not here does not exist. Tables are pandas DataFrames with the columns their
producer's docstring lists; values are in `unit` (pp for an accuracy, x100).

  Prepared     the runs table read for analysis (stats.prepare)
  Stats        + per-arm statistics and every pairwise test (stats.arms_and_pairs)
  Analysis     + the declaration, its contrasts, noise floors, attribution, software, agreement,
                 scope and the confirmatory re-analysis (answer.study_analysis)
  Attribution  the factor effects and the platform gap decomposition
               (attribution.factor_attribution)
  Agreement    agreement between models from saved predictions (agreement_section)
  Scope        what was analysed against what was declared (answer.scope)
  Software     each platform's device and package versions (answer.software)
(module names under analysis/numbers/)
Reference: docs/statistics.md.
"""

import dataclasses
from typing import Any, Optional

import pandas as pd

from analysis.agreement import Agreement
from analysis.attribution import Attribution
from analysis.stats import Stats


@dataclasses.dataclass
class Scope:
  """Confirmatory (True: the declared seeds at the declared margin), exploratory (False) or
  nothing declared (None), with the `deviations` from the declaration in words."""

  declared_seeds: Optional[list[int]]
  declared_margin: Optional[float]
  analysed_seeds: list[int]
  margin: float
  deviations: list[str]
  declared_seeds_present: bool
  confirmatory: Optional[bool]


@dataclasses.dataclass
class Software:
  """`platforms`: {platform: {'device_kind', the CPU facts, 'devices', 'versions': {package:
  version}}}; `confounds`: the packages whose versions differ between platforms."""

  platforms: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  confounds: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Analysis(Stats):
  """Stats plus the study's `declared` declaration and `source`; `contrasts` (the declared
  family, or None), `arm_info` (contrasts.arm_levels, or None), `noise` ({platform:
  noise floor}), `attribution`, `software`, `agreement` (None for a CSV: no run folders),
  `scope`, and for an exploratory analysis `confirmatory` (the same analysis of the declared
  seeds at the declared margin)."""

  declared: dict[str, Any] = dataclasses.field(default_factory=dict)
  source: str = ''
  contrasts: Optional[pd.DataFrame] = None
  arm_info: Optional[pd.DataFrame] = None
  noise: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  attribution: Optional[Attribution] = None
  software: Software = dataclasses.field(default_factory=Software)
  agreement: Optional[Agreement] = None
  scope: Optional[Scope] = None
  confirmatory: Optional['Analysis'] = None
