"""The base of every configuration section: a number the code cannot use is refused when the file is read, not later.

Every section of ``edge-agent.toml`` (the daemon's, the trainer's, a backend's, a strategy's) derives from
:class:`Section`: unknown keys are errors, a section is frozen once read, and a number is refused where it is not
finite (TOML writes ``inf`` and ``nan``) or is past what the code can hold: an integer past :data:`MAX_INT` (SQLite's
INTEGER, torch's seed) or a decimal past :data:`MAX_FLOAT` (a wait that long overflows the thread library's timeout;
in seconds it is 31 years); so is a string holding a NUL character (``\\u0000``), which no path, name or address can.
A key's own bounds, where it has them, are checked too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

__all__ = ["MAX_FLOAT", "MAX_INT", "Section"]

#: The largest integer any option takes: SQLite stores 64-bit integers, ``torch.manual_seed`` takes at most this.
MAX_INT = 2**63 - 1

#: The largest decimal any option takes: ``threading`` refuses waits past about 9.2e9 s.
MAX_FLOAT = 1e9


def _check(value: Any) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
        raise ValueError(f"Input should be at most {MAX_INT} in size, the largest integer an option takes")
    if isinstance(value, float) and not -MAX_FLOAT <= value <= MAX_FLOAT:
        raise ValueError(f"Input should be at most {MAX_FLOAT:g} in size, the largest number an option takes")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("Input should not hold a NUL character (\\u0000): no path or name can")
    if isinstance(value, (list, tuple)):
        for item in value:
            _check(item)
    elif isinstance(value, dict):
        for item in value.values():
            _check(item)


class Section(BaseModel):
    """A configuration section: unknown keys, infinities, NaN, numbers past :data:`MAX_INT` / :data:`MAX_FLOAT` and NUL characters are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _within_reach(cls, value: Any) -> Any:
        _check(value)
        return value
