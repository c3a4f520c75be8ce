"""How far each class can be trusted here: the expert's labels read against the model's own answers.

A *check* is an expert label for a photo the model had answered ``confident``: right when the expert named the
class the model did. A class earns pseudo-labels on this device once its last ``[labels] trust_window`` checks
number at least ``trust_checks`` and the lower end of their precision's one-standard-error interval (Wilson score)
reaches ``trust_precision``; until then its confident photos go to the expert instead. Every expert label, checks or
not, also feeds the confusion table the web page shows (what the model said, what the expert said).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_agent.config import LabelsSection
    from edge_agent.results import ResultsDB

__all__ = ["ClassTrust", "TrustBook", "TrustRow", "class_trust", "confusion", "trust_table", "wilson_lower"]


def wilson_lower(right: int, n: int, z: float = 1.0) -> float:
    """The lower end of the Wilson score interval of ``right`` of ``n`` (``z`` standard errors; 0 for no checks)."""
    if n <= 0:
        return 0.0
    p = right / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n))


@dataclass(frozen=True)
class ClassTrust:
    """One class's checks (its latest ``trust_window``) and whether they earn it pseudo-labels."""

    label: str
    checks: int
    right: int
    lower: float  # Wilson lower bound of the precision of its confident answers
    trusted: bool

    @property
    def precision(self) -> float | None:
        return self.right / self.checks if self.checks else None


def _standing(label: str, window: list[bool], policy: LabelsSection) -> ClassTrust:
    """The trust rule, for a class with these checks (none for a class never checked)."""
    n, right = len(window), sum(window)
    lower = wilson_lower(right, n)
    return ClassTrust(label, n, right, lower, policy.trust_checks == 0 or (n >= policy.trust_checks and lower >= policy.trust_precision))


def _trust(checks: list[tuple], policy: LabelsSection) -> dict[str, ClassTrust]:
    seen: dict[str, list[bool]] = {}
    for said, verdict, expert in checks:  # newest first
        if verdict != "confident":
            continue
        window = seen.setdefault(said, [])
        if len(window) < policy.trust_window:
            window.append(said == expert)
    return {label: _standing(label, window, policy) for label, window in seen.items()}


def _confusion(checks: list[tuple]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for said, _verdict, expert in checks:
        row = table.setdefault(said, {})
        row[expert] = row.get(expert, 0) + 1
    return table


def class_trust(db: ResultsDB, policy: LabelsSection) -> dict[str, ClassTrust]:
    """Every class the expert has checked, with its standing (a class never checked is absent)."""
    return _trust(db.expert_checks(), policy)


def confusion(db: ResultsDB) -> dict[str, dict[str, int]]:
    """What the model said -> what the expert said -> how many photos, over every expert label."""
    return _confusion(db.expert_checks())


@dataclass(frozen=True)
class TrustRow:
    """One line of the page's trust table: a class the model named on photos the expert labelled."""

    label: str
    labelled: int  # photos the model gave this class that the expert labelled
    right: int  # of which the expert agreed
    checks: int
    precision: float | None
    lower: float
    trusted: bool

    @property
    def right_share(self) -> float:
        return self.right / self.labelled if self.labelled else 0.0


def trust_table(db: ResultsDB, policy: LabelsSection) -> tuple[list[TrustRow], dict[str, dict[str, int]], list[str]]:
    """The trust table's rows (most labelled first), the confusion counts and their columns (the expert's classes)."""
    checks = db.expert_checks()
    table, trust = _confusion(checks), _trust(checks, policy)
    rows = []
    for label, said in table.items():
        t = trust.get(label) or _standing(label, [], policy)
        rows.append(TrustRow(label, sum(said.values()), said.get(label, 0), t.checks, t.precision, t.lower, t.trusted))
    rows.sort(key=lambda r: (-r.labelled, r.label))
    named = {c for said in table.values() for c in said}
    columns = [r.label for r in rows if r.label in named] + sorted(named - {r.label for r in rows})
    return rows, table, columns


class TrustBook:
    """The daemon's view of :func:`class_trust`, read again only when the expert has labelled something new."""

    def __init__(self, db: ResultsDB, policy: LabelsSection) -> None:
        self.db, self.policy = db, policy
        self._stamp: tuple[int, float] | None = None
        self._trust: dict[str, ClassTrust] = {}

    def now(self) -> Callable[[str], bool]:
        """Whether a class's confident answers may become pseudo-labels, as the checks stand now (one query)."""
        if self.policy.trust_checks == 0:  # every class trusted: nothing to read
            return lambda label: True
        stamp = self.db.expert_stamp()
        if stamp != self._stamp:
            self._trust, self._stamp = class_trust(self.db, self.policy), stamp
        trust = self._trust
        return lambda label: label in trust and trust[label].trusted

    def trusted(self, label: str) -> bool:
        """Whether ``label``'s confident answers may become pseudo-labels now."""
        return self.now()(label)
