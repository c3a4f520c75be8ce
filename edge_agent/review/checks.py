"""How far each class can be trusted here: the expert's labels read against the model's own answers.

A *check* is an expert label for a photo the model had answered ``confident``: right when the expert named the
class the model did. A class earns pseudo-labels on this device once its last ``[labels] trust_window`` checks
number at least ``trust_checks`` and the lower end of their precision's one-standard-error interval (Wilson score)
reaches ``trust_precision``; until then its confident photos go to the expert instead. Every expert label, checks or
not, also feeds the confusion table the web page shows (what the model said, what the expert said).
"""

from __future__ import annotations

import math
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

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "checks": self.checks,
            "right": self.right,
            "precision": None if self.precision is None else round(self.precision, 4),
            "lower": round(self.lower, 4),
            "trusted": self.trusted,
        }


def class_trust(db: ResultsDB, policy: LabelsSection) -> dict[str, ClassTrust]:
    """Every class the expert has checked, with its standing (a class never checked is absent: not trusted)."""
    seen: dict[str, list[bool]] = {}
    for said, verdict, expert in db.expert_checks():  # newest first
        if verdict != "confident":
            continue
        window = seen.setdefault(said, [])
        if len(window) < policy.trust_window:
            window.append(said == expert)
    out = {}
    for label, window in seen.items():
        n, right = len(window), sum(window)
        lower = wilson_lower(right, n)
        out[label] = ClassTrust(label, n, right, lower, n >= policy.trust_checks and lower >= policy.trust_precision)
    return out


def confusion(db: ResultsDB) -> dict[str, dict[str, int]]:
    """What the model said -> what the expert said -> how many photos, over every expert label."""
    table: dict[str, dict[str, int]] = {}
    for said, _verdict, expert in db.expert_checks():
        row = table.setdefault(said, {})
        row[expert] = row.get(expert, 0) + 1
    return table


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
    table = confusion(db)
    trust = class_trust(db, policy)
    rows = []
    for label, said in table.items():
        t = trust.get(label) or ClassTrust(label, 0, 0, 0.0, policy.trust_checks == 0)
        trusted = t.trusted or policy.trust_checks == 0
        rows.append(TrustRow(label, sum(said.values()), said.get(label, 0), t.checks, t.precision, t.lower, trusted))
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

    def trusted(self, label: str) -> bool:
        """Whether ``label``'s confident answers may become pseudo-labels now."""
        if self.policy.trust_checks == 0:
            return True
        stamp = self.db.expert_stamp()
        if stamp != self._stamp:
            self._trust, self._stamp = class_trust(self.db, self.policy), stamp
        t = self._trust.get(label)
        return t is not None and t.trusted
