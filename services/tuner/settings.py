"""The tuner's config sections (``tuner.bandit``, ``tuner.budgets``) as dataclasses: reading one from a mapping,
and the value checks their ``validate`` methods share. Every error is a ``TunerConfigError`` naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from services.tuner.arms import TunerConfigError


def check_int(value: Any, where: str, lo: int) -> int:
    """``value`` if it is an integer ``>= lo``. Raises ``TunerConfigError`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise TunerConfigError(f"{where}: must be an integer >= {lo}, got {value!r}")
    return value


def check_number(value: Any, where: str, lo: float, hi: float, open_: bool = False) -> float:
    """``value`` if it is a number in ``[lo, hi]`` (``open_``: in ``(lo, hi)``). Raises ``TunerConfigError``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not (lo < value < hi if open_ else lo <= value <= hi):
        span = f"({lo}, {hi})" if open_ else f"[{lo}, {hi}]"
        raise TunerConfigError(f"{where}: must be a number in {span}, got {value!r}")
    return float(value)


class Settings:
    """Base of a settings dataclass read from config section ``tuner.<SECTION>``; its ``__post_init__`` calls
    ``validate(source="config")``, which names keys as ``f"{source}: tuner.{SECTION}.<key>"``."""

    SECTION = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, source: str = "config") -> None:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, source: str = "config"):
        """Build from a config mapping. Raises ``TunerConfigError`` on an unknown key or a bad value, naming
        ``source`` (a file, or ``config``) and the key."""
        d = dict(d or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise TunerConfigError(
                f"{source}: tuner.{cls.SECTION}: unknown key(s) {unknown}; allowed: {known}"
            )
        try:
            return cls(**d)
        except TunerConfigError as e:  # validated as "config": name the real source
            raise TunerConfigError(str(e).replace("config: ", f"{source}: ", 1)) from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
