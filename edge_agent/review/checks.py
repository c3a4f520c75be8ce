"""How far each class can be trusted here: the expert's labels read against the model's own answers.

A *check* is an expert label for a photo the model had answered ``confident`` at ``[labels] trust_confidence``
(0.98) or above: right when the expert named the class the model did. Trust covers only such answers: replayed on
real orchard photos (``benchmarks.check_order``), a retrained v3000's confident answers from 0.9 up were right 83-95 %
of the time per class, too few for pseudo-labels, and those from 0.98 up 95-100 % for the disease classes. A class
earns pseudo-labels on this device when its latest ``[labels] trust_window`` checks pass
a sequential probability ratio test (Wald): each right check adds ``log(p1 / p0)`` and each wrong one
``log((1 - p1) / (1 - p0))``, with ``p1 = trust_precision`` (what a trusted class is expected to show) and
``p0 = trust_against`` (a class this often right, or less, must not earn trust); it is trusted once the sum reaches
``log(1 / trust_error)``, and ``trust_checks`` checks at least. With the defaults (0.97 against 0.85) that is 23
right checks in a row, and a mistake bars trust until it leaves the latest ``trust_window`` (30) checks; a class the
expert keeps correcting never gets there. ``trust_rule = "wilson"`` keeps the rule before 2026-11 (19 right
checks). Until then its confident photos go to the expert instead, the class nearest to trust first
(:func:`nearest_first`). Once trusted, ``[labels] audit_share`` of them (:func:`audited`, drawn by photo) still go
to the expert, as *audits*: checks like any other, so a class whose sure answers go wrong, an engine worse at it
after a swap, loses its trust at the first wrong one and earns it again only once that check has left its latest
``trust_window`` (30 right checks with the defaults). Every expert label, checks or not,
also feeds the confusion table the web page shows (what the model said, what the expert said).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_agent.log import get_logger
from edge_agent.review.rank import draw

if TYPE_CHECKING:
    from edge_agent.config import LabelsSection
    from edge_agent.results import ResultsDB

__all__ = [
    "ClassTrust",
    "TrustBook",
    "TrustRow",
    "audit_tally",
    "audited",
    "check_evidence",
    "check_windows",
    "class_trust",
    "confusion",
    "covered",
    "nearest_first",
    "right_checks_to_trust",
    "standing",
    "standings",
    "trust_table",
    "wilson_lower",
]


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
    lower: float  # Wilson lower bound of the precision of its confident answers (shown on the page)
    trusted: bool
    needed: int = 0  # right checks in a row that would earn it trust (0: trusted)

    @property
    def precision(self) -> float | None:
        return self.right / self.checks if self.checks else None


def standing(label: str, window: list[bool], policy: LabelsSection) -> ClassTrust:
    """The trust rule (``[labels] trust_rule``), for a class with these checks (none for a class never checked)."""
    n, right = len(window), sum(window)
    lower = wilson_lower(right, n)
    if policy.trust_checks == 0:
        return ClassTrust(label, n, right, lower, True)
    if policy.trust_rule == "wilson":
        trusted = n >= policy.trust_checks and lower >= policy.trust_precision
        needed = 0 if trusted else _wilson_needed(right, n, policy)
        return ClassTrust(label, n, right, lower, trusted, needed)
    needed = _sequential_needed(window, policy)
    return ClassTrust(label, n, right, lower, needed == 0, needed)


def _sequential_needed(window: list[bool], policy: LabelsSection) -> int:
    """Right checks in a row from now that pass the test, counting the older checks that leave the window meanwhile."""
    up, down, bound = _steps(policy)
    size = policy.trust_window
    for more in range(0, size + 1):
        kept = window[: max(0, size - more)]
        n = more + len(kept)
        evidence = (more + sum(kept)) * up + (len(kept) - sum(kept)) * down
        if n >= policy.trust_checks and evidence >= bound - 1e-9:
            return more
    return size + 1  # a window of right checks is not enough: out of reach with these settings


def right_checks_to_trust(policy: LabelsSection) -> int:
    """Right checks in a row whose evidence alone reaches the sequential rule's bound (23 with the defaults)."""
    up, _, bound = _steps(policy)
    return math.ceil(bound / up - 1e-9)


def check_evidence(right: int, wrong: int, policy: LabelsSection) -> float:
    """The sequential test's log-likelihood ratio of ``right`` and ``wrong`` checks: above 0 they favour answers right
    ``trust_precision`` of the time (0.97) over answers right ``trust_against`` of the time (0.85); one wrong check
    outweighs 12 right ones with the defaults."""
    up, down, _ = _steps(policy)
    return right * up + wrong * down


def _steps(policy: LabelsSection) -> tuple[float, float, float]:
    """The test's step for a right check, for a wrong one, and the bound its sum must reach."""
    p1, p0 = policy.trust_precision, policy.trust_against
    return math.log(p1 / p0), math.log((1 - p1) / (1 - p0)), math.log(1 / policy.trust_error)


def _wilson_needed(right: int, n: int, policy: LabelsSection) -> int:
    for more in range(0, 10 * max(policy.trust_window, policy.trust_checks) + 1):
        if n + more >= policy.trust_checks and wilson_lower(right + more, n + more) >= policy.trust_precision:
            return more
    return 10 * max(policy.trust_window, policy.trust_checks) + 1  # out of reach within any window


def nearest_first(windows: dict[str, list[bool]], policy: LabelsSection) -> list[str]:
    """Untrusted classes ordered to be checked: the fewest right checks from trust first, so the expert's checks
    finish one class's test before they start the next (spread evenly, no class might get there in a season)."""
    open_ = [(t.needed, label) for label, w in windows.items() if not (t := standing(label, w, policy)).trusted]
    return [label for _, label in sorted(open_)]


def covered(verdict: str | None, confidence: float | None, policy: LabelsSection) -> bool:
    """Whether trust covers this answer: a ``confident`` one at ``trust_confidence`` or above (``pseudo_threshold``
    where that is higher; any confident one when ``trust_checks`` is 0). Only such answers are checks, and only they
    become pseudo-labels once their class is trusted."""
    if verdict != "confident":
        return False
    if policy.trust_checks == 0:
        return True
    return confidence is not None and confidence >= policy.trust_from


def audited(sha256: str, policy: LabelsSection) -> bool:
    """Whether a photo's answer, were its class trusted, still goes to the expert as a check: ``audit_share`` of
    photos, drawn by their sha256 (the same photo the same way at every answer; none where ``trust_checks`` is 0)."""
    return policy.trust_checks > 0 and draw("audit:" + sha256) < policy.audit_share


def check_windows(checks: list[tuple], policy: LabelsSection) -> dict[str, list[bool]]:
    """Each class's latest ``trust_window`` checks, newest first (right or not), from ``expert_checks()`` rows."""
    seen: dict[str, list[bool]] = {}
    for said, verdict, expert, confidence, *_ in checks:  # newest first
        if not covered(verdict, confidence, policy):
            continue
        window = seen.setdefault(said, [])
        if len(window) < policy.trust_window:
            window.append(said == expert)
    return seen


def audit_tally(checks: list[tuple], policy: LabelsSection) -> dict[str, tuple[int, int]]:
    """Per class, its checks that were audits (the photo one :func:`audited` draws, the class trusted when the expert
    labelled it) and how many of them the expert agreed with: how right its pseudo-labels were found, from
    ``expert_checks()`` rows (the checks replayed oldest first, each judged on the window before it)."""
    windows: dict[str, list[bool]] = {}
    out: dict[str, tuple[int, int]] = {}
    for said, verdict, expert, confidence, sha256, *_ in reversed(checks):
        if not covered(verdict, confidence, policy):
            continue
        window = windows.setdefault(said, [])
        if audited(sha256, policy) and standing(said, window, policy).trusted:
            n, right = out.get(said, (0, 0))
            out[said] = (n + 1, right + (said == expert))
        window.insert(0, said == expert)
        del window[policy.trust_window :]
    return out


def standings(checks: list[tuple], policy: LabelsSection) -> dict[str, ClassTrust]:
    """Every checked class's standing as ``expert_checks()`` rows stand (a class never checked is absent)."""
    return {label: standing(label, window, policy) for label, window in check_windows(checks, policy).items()}


def _confusion(checks: list[tuple]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for said, _verdict, expert, *_ in checks:
        row = table.setdefault(said, {})
        row[expert] = row.get(expert, 0) + 1
    return table


def class_trust(db: ResultsDB, policy: LabelsSection) -> dict[str, ClassTrust]:
    """Every class the expert has checked, with its standing (a class never checked is absent)."""
    return standings(db.expert_checks(), policy)


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
    needed: int = 0  # right checks in a row that would earn it trust
    right_checks: int = 0  # of its checks, those the expert agreed with
    audits: int = 0  # of its checks, those asked while it was trusted (:func:`audit_tally`)
    right_audits: int = 0  # of its audits, those the expert agreed with

    @property
    def right_share(self) -> float:
        return self.right / self.labelled if self.labelled else 0.0


def trust_table(db: ResultsDB, policy: LabelsSection) -> tuple[list[TrustRow], dict[str, dict[str, int]], list[str]]:
    """The trust table's rows (most labelled first), the confusion counts and their columns (the expert's classes)."""
    checks = db.expert_checks()
    table, trust, audits = _confusion(checks), standings(checks, policy), audit_tally(checks, policy)
    rows = []
    for label, said in table.items():
        t = trust.get(label) or standing(label, [], policy)
        a = audits.get(label, (0, 0))
        rows.append(
            TrustRow(label, sum(said.values()), said.get(label, 0), t.checks, t.precision, t.lower, t.trusted, t.needed, t.right, *a)
        )
    rows.sort(key=lambda r: (-r.labelled, r.label))
    named = {c for said in table.values() for c in said}
    columns = [r.label for r in rows if r.label in named] + sorted(named - {r.label for r in rows})
    return rows, table, columns


class TrustBook:
    """The daemon's view of :func:`class_trust`, read again only when the expert has labelled something new."""

    def __init__(self, db: ResultsDB, policy: LabelsSection) -> None:
        self.db, self.policy = db, policy
        self.log = get_logger("trust")
        self._stamp: tuple[int, float] | None = None
        self._trust: dict[str, ClassTrust] = {}

    def _read(self) -> dict[str, ClassTrust]:
        """Each checked class's standing as the checks stand now (one query; read again only after a new label)."""
        stamp = self.db.expert_stamp()
        if stamp != self._stamp:
            trust = class_trust(self.db, self.policy)
            if self._stamp is not None:
                self._say_changes(trust)
            self._trust, self._stamp = trust, stamp
        return self._trust

    def _say_changes(self, trust: dict[str, ClassTrust]) -> None:
        """The journal's lines for the classes that earned trust, or lost it, with the latest labels."""
        was = {label for label, t in self._trust.items() if t.trusted}
        now = {label for label, t in trust.items() if t.trusted}
        if now - was:
            self.log.info("class_trust_earned", classes=sorted(now - was), effect="their sure answers become pseudo-labels")
        if was - now:
            self.log.warning(
                "class_trust_lost",
                classes=sorted(was - now),
                effect="its latest checks no longer pass the test (a sure answer found wrong): its sure answers go to the "
                "expert again until right checks earn it back",
            )

    def now(self) -> Callable[[str], bool]:
        """Whether a class's confident answers may become pseudo-labels, as the checks stand now (one query)."""
        if self.policy.trust_checks == 0:  # every class trusted: nothing to read
            return lambda label: True
        trust = self._read()
        return lambda label: label in trust and trust[label].trusted

    def trusted_classes(self) -> frozenset[str] | None:
        """The classes whose confident answers may become pseudo-labels now (None: every class, ``trust_checks = 0``)."""
        if self.policy.trust_checks == 0:
            return None
        return frozenset(label for label, t in self._read().items() if t.trusted)

    def known(self) -> frozenset[str] | None:
        """The classes trusted as the last read found them, with no query (None: not read yet, or every class with
        ``trust_checks = 0``): what the daemon's status tells its alerts (the pipeline reads the checks again at every
        idle turn)."""
        if self.policy.trust_checks == 0 or self._stamp is None:
            return None
        return frozenset(label for label, t in self._trust.items() if t.trusted)

    def trusted(self, label: str) -> bool:
        """Whether ``label``'s confident answers may become pseudo-labels now."""
        return self.now()(label)
