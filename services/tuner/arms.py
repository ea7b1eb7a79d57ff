"""Strategy space of the tuner: one *arm* is one way to run a decode step.

An arm is ``(drafter, max_draft_tokens, tree_width, tree_depth)``:

- ``drafter``: which drafter proposes (``off`` = plain decoding, no draft);
  ``suffix`` = the nonparametric suffix-tree drafter, ``learned`` = the EAGLE-style drafter,
  ``ngram`` = the prompt/output n-gram lookup, ``hybrid`` = per request, the suffix draft when its score
  (``DraftTree.score``) clears the strategy's threshold, else the learned drafter's draft.
- ``max_draft_tokens``: the most draft nodes per request (``k``; 0 for ``off``, > 0 for every drafter).
- ``tree_width``: the most children per node (1 = a chain).
- ``tree_depth``: the most levels, 0 = as deep as ``max_draft_tokens`` allows (so a chain of k has depth k).

These map one-to-one onto ``Drafter.propose(requests, max_tokens, width, depth)`` in
``services/rollout_actor/speculative/base.py``; the per-request ``max_tokens`` is the arm's
``max_draft_tokens`` capped by the length-aware budget (``services/tuner/budgets.py``).

Arms are listed in config (a list of mappings, or of names such as ``"suffix-k8-w1"``); ``parse_arms``
validates them and fails with a ``TunerConfigError`` that names the offending entry and key. ``off`` is
always an arm (added in front when missing): the bandit needs it as the baseline that guards against
regret (see ``bandit.py``). ``default_arms()`` is the shipped default list.

The arm space follows TLT's bucketed-epsilon-greedy strategy space (arXiv 2511.16665): a drafter and a draft
shape, chosen per batch-size bucket.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any


class TunerConfigError(ValueError):
    """Invalid tuner configuration (arms, bandit or budget settings). The message names the bad entry."""


class Drafter(StrEnum):
    """Drafter names as they appear in config and in arm names (a ``str`` enum)."""

    OFF = "off"
    SUFFIX = "suffix"
    LEARNED = "learned"
    NGRAM = "ngram"
    HYBRID = "hybrid"


DRAFTER_NAMES: tuple[str, ...] = tuple(d.value for d in Drafter)
ARM_KEYS: tuple[str, ...] = ("drafter", "max_draft_tokens", "tree_width", "tree_depth")
_NAME_RE = re.compile(r"^(?P<drafter>[a-z]+)-k(?P<k>\d+)-w(?P<w>\d+)(?:-d(?P<d>\d+))?$")


def _as_int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TunerConfigError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def _as_drafter(value: Any, where: str) -> Drafter:
    if isinstance(value, Drafter):
        return value
    if isinstance(value, str):
        try:
            return Drafter(value.strip().lower())
        except ValueError:
            pass
    raise TunerConfigError(f"{where}: unknown drafter {value!r}; expected one of {', '.join(DRAFTER_NAMES)}")


@dataclass(frozen=True)
class Arm:
    """One strategy: drafter plus draft shape. Immutable and hashable; validated on construction."""

    drafter: Drafter
    max_draft_tokens: int = 0
    tree_width: int = 1
    tree_depth: int = 0

    def __post_init__(self) -> None:
        where = f"arm {self.drafter!r}"
        drafter = _as_drafter(self.drafter, where)
        object.__setattr__(self, "drafter", drafter)
        k = _as_int(self.max_draft_tokens, "max_draft_tokens", where)
        w = _as_int(self.tree_width, "tree_width", where)
        d = _as_int(self.tree_depth, "tree_depth", where)
        object.__setattr__(self, "max_draft_tokens", k)
        object.__setattr__(self, "tree_width", w)
        object.__setattr__(self, "tree_depth", d)
        where = f"arm {drafter.value}-k{k}-w{w}" + (f"-d{d}" if d else "")
        if drafter is Drafter.OFF:
            if k != 0 or w != 1 or d != 0:
                raise TunerConfigError(
                    f"{where}: drafter 'off' takes no draft (max_draft_tokens=0, tree_width=1, tree_depth=0)"
                )
            return
        if k <= 0:
            raise TunerConfigError(
                f"{where}: max_draft_tokens must be > 0 for drafter {drafter.value!r}, got {k}"
            )
        if w < 1:
            raise TunerConfigError(f"{where}: tree_width must be >= 1, got {w}")
        if d < 0:
            raise TunerConfigError(
                f"{where}: tree_depth must be >= 0 (0 = as deep as the budget allows), got {d}"
            )
        if d > k:
            raise TunerConfigError(f"{where}: tree_depth ({d}) cannot exceed max_draft_tokens ({k})")
        if w > 1 and d == 0:
            raise TunerConfigError(f"{where}: a tree (tree_width > 1) needs tree_depth > 0")

    @cached_property
    def name(self) -> str:
        """Stable, unique name: ``off``, ``suffix-k8-w1``, ``learned-k16-w2-d4`` (depth only when set); computed
        once (read several times per decode step)."""
        if self.drafter is Drafter.OFF:
            return "off"
        base = f"{self.drafter.value}-k{self.max_draft_tokens}-w{self.tree_width}"
        return f"{base}-d{self.tree_depth}" if self.tree_depth else base

    @property
    def is_off(self) -> bool:
        return self.drafter is Drafter.OFF

    @property
    def depth(self) -> int:
        """Effective number of levels (sequential draft passes): ``tree_depth`` or, when 0, the chain length."""
        return self.tree_depth or self.max_draft_tokens

    def __str__(self) -> str:
        return self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter.value,
            "max_draft_tokens": self.max_draft_tokens,
            "tree_width": self.tree_width,
            "tree_depth": self.tree_depth,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any], where: str = "arm") -> Arm:
        """Build from a mapping with keys ``drafter`` (required) and optional ``max_draft_tokens``,
        ``tree_width``, ``tree_depth``. Unknown keys are errors (typos must not pass silently)."""
        if not isinstance(d, Mapping):
            raise TunerConfigError(f"{where}: expected a mapping with keys {ARM_KEYS}, got {d!r}")
        keys = [str(k) for k in d.keys()]
        unknown = [k for k in keys if k not in ARM_KEYS]
        if unknown:
            raise TunerConfigError(f"{where}: unknown key(s) {unknown}; allowed keys are {list(ARM_KEYS)}")
        if "drafter" not in keys:
            raise TunerConfigError(f"{where}: missing required key 'drafter'")
        drafter = _as_drafter(d["drafter"], where)
        kwargs: dict[str, int] = {}
        for key in ARM_KEYS[1:]:
            if key in keys:
                kwargs[key] = _as_int(d[key], key, where)
        try:
            return Arm(drafter, **kwargs)
        except TunerConfigError as e:
            raise TunerConfigError(f"{where}: {e}") from None

    @staticmethod
    def from_name(name: str, where: str = "arm") -> Arm:
        """Inverse of ``name``: ``"off"``, ``"suffix-k8-w1"``, ``"learned-k16-w2-d4"``."""
        if not isinstance(name, str):
            raise TunerConfigError(f"{where}: expected an arm name string, got {name!r}")
        s = name.strip().lower()
        if s == "off":
            return Arm(Drafter.OFF)
        m = _NAME_RE.match(s)
        if m is None:
            drafter = s.split("-", 1)[0]
            _as_drafter(drafter, where)  # an unknown drafter gets the clearer message
            raise TunerConfigError(
                f"{where}: cannot parse arm name {name!r}; expected 'off' or '<drafter>-k<K>-w<W>[-d<D>]'"
            )
        drafter = _as_drafter(m["drafter"], where)
        try:
            return Arm(drafter, int(m["k"]), int(m["w"]), int(m["d"] or 0))
        except TunerConfigError as e:
            raise TunerConfigError(f"{where}: {e}") from None


OFF = Arm(Drafter.OFF)


def default_arms() -> list[Arm]:
    """The shipped strategy space: ``off``, cheap n-gram chains, suffix chains of depth 4..32 (a GRPO group's
    siblings make long drafts pay in the long tail: tau ~6 at k = 16 on real reasoning rollouts), learned
    chains of depth 2..6, two tree shapes, and hybrid chains. Eleven arms keep per-bucket exploration
    affordable."""
    return [
        OFF,
        Arm(Drafter.NGRAM, 3),
        Arm(Drafter.SUFFIX, 4),
        Arm(Drafter.SUFFIX, 8),
        Arm(Drafter.SUFFIX, 16),
        Arm(Drafter.SUFFIX, 32),
        Arm(Drafter.LEARNED, 2),
        Arm(Drafter.LEARNED, 4),
        Arm(Drafter.LEARNED, 12, tree_width=2, tree_depth=6),
        Arm(Drafter.SUFFIX, 24, tree_width=3, tree_depth=8),
        Arm(Drafter.HYBRID, 8),
    ]


def parse_arms(entries: Iterable[Any] | None, source: str = "config") -> list[Arm]:
    """Validate a configured arm list.

    Each entry is an ``Arm``, a mapping (``{"drafter": "suffix", "max_draft_tokens": 8}``) or an arm name
    (``"suffix-k8-w1"``). Errors name ``source`` and the entry index, e.g.
    ``config: tuner.arms[2]: unknown drafter 'eagle'; expected one of off, suffix, learned, ngram, hybrid``.
    Duplicates are errors. ``off`` is put in front when missing. Returns the arms in config order.
    """
    if entries is None:
        raise TunerConfigError(
            f"{source}: tuner.arms: the arm list is missing; list at least one arm (or use defaults)"
        )
    if isinstance(entries, (str, bytes, Mapping)):
        raise TunerConfigError(f"{source}: tuner.arms: expected a list of arms, got {type(entries).__name__}")
    items = list(entries)
    if not items:
        raise TunerConfigError(
            f"{source}: tuner.arms: the arm list is empty; list at least one arm (or use defaults)"
        )
    arms: list[Arm] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(items):
        where = f"{source}: tuner.arms[{i}]"
        if isinstance(entry, Arm):
            arm = entry
        elif isinstance(entry, str):
            arm = Arm.from_name(entry, where)
        elif isinstance(entry, Mapping) or hasattr(entry, "keys"):
            arm = Arm.from_dict(dict(entry.items()), where)
        else:
            raise TunerConfigError(f"{where}: expected a mapping or an arm name, got {entry!r}")
        if arm.name in seen:
            raise TunerConfigError(f"{where}: duplicate arm {arm.name!r} (same as arms[{seen[arm.name]}])")
        seen[arm.name] = i
        arms.append(arm)
    if OFF.name not in seen:
        arms.insert(0, OFF)
    return arms
