"""A pseudo-label is taken back once the expert finds a sure answer of its class by its engine wrong.

A class's pseudo-labels rest on its checks (:mod:`edge_agent.review.checks`). An audit found wrong takes the class's
trust away, but the pseudo-labels made on that trust would stay: those still queued would go to the trainer, and those
delivered would be trained on at every retrain, where the trainer's recheck (:mod:`trainer.recheck`) asks the engine in
service, the very engine found wrong, and so cannot catch them. So when the expert gives another class to a photo the
model had answered sure (a check: :func:`edge_agent.review.checks.covered`), the class is not trusted after it (with
the default test a wrong check always costs the trust; ``trust_rule = "wilson"`` may keep it, and then its pseudo-labels
with it), and that engine's own checks of the class, all of them, now favour an engine right ``trust_against`` (0.85)
of the time over one right ``trust_precision`` (0.97) of the time (the trust test's likelihood ratio below 1: one
wrong check outweighs 12 right ones), every pseudo-label of that class made by that engine version is taken back: those still queued return to the review pool (checks again), and those delivered
are withdrawn from the trainer (the hand-off's ``withdraw``), which keeps their photos as unlabelled ones. That class's
pseudo-labels made by other versions stay (the recheck asks the engine in service about them), and so do those made
after it, should the class earn trust again. An engine whose checks of the class still favour it (the one whose 23
right checks earned the trust, found wrong once: right 97 % of the time makes one such mistake in 33) keeps its
pseudo-labels: the trust goes, as the test says, but what the engine made on it stands. Each expert label is read once (``withdraw_seen``; a ledger from before
counts its labels as read). Nothing is withdrawn with ``trust_checks = 0`` (every class trusted, no test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_agent.review.checks import check_evidence, covered, standings

if TYPE_CHECKING:
    from edge_agent.config import LabelsSection
    from edge_agent.results import ResultsDB

__all__ = ["Withdrawal", "Withdrawals", "found_wrong"]


@dataclass(frozen=True)
class Withdrawal:
    """What one look took back: the (class, engine version) pairs found wrong, the pseudo-labels returned to the review
    pool, and those delivered that are now to be withdrawn from the trainer."""

    found: tuple[tuple[str, str], ...]
    pooled: int
    marked: int


def found_wrong(new: list[tuple], checks: list[tuple], policy: LabelsSection) -> list[tuple[str, str]]:
    """The (class, engine version) pairs of the checks among ``new`` that the expert found wrong, where, as every check
    (``checks``; both ``expert_checks()`` rows) stands now, that class is not trusted and that engine's own checks of
    it favour an engine right ``trust_against`` of the time (:func:`edge_agent.review.checks.check_evidence` below 0)."""
    trusted = {label for label, t in standings(checks, policy).items() if t.trusted}
    tally: dict[tuple[str, str], list[int]] = {}
    for said, verdict, expert, confidence, _sha, version, _labelled in checks:
        if covered(verdict, confidence, policy):
            tally.setdefault((said, version), [0, 0])[said != expert] += 1
    pairs = {
        (said, version)
        for said, verdict, expert, confidence, _sha, version, _labelled in new
        if said != expert
        and said not in trusted
        and covered(verdict, confidence, policy)
        and check_evidence(*tally[(said, version)], policy) < 0
    }
    return sorted(pairs)


class Withdrawals:
    """The withdrawal step (see the module), run by the daemon while it is idle; reads the checks' stamp alone (one
    query) where the expert labelled nothing since the last look."""

    def __init__(self, db: ResultsDB, policy: LabelsSection) -> None:
        self.db, self.policy = db, policy
        self._stamp: tuple | None = None
        #: Looks that took something back since the start, and the latest of them (the daemon's status, its alerts).
        self.taken = 0
        self.last: Withdrawal | None = None

    def run(self) -> Withdrawal | None:
        """Take back what the expert's new labels found wrong; None where there were none to read."""
        if self.policy.trust_checks == 0:
            return None
        stamp = self.db.expert_stamp()
        if stamp == self._stamp:
            return None
        seen = self.db.withdraw_seen()
        checks = self.db.expert_checks()
        new = [c for c in checks if c[4] not in seen or c[6] > seen[c[4]]]
        done = None
        if new:
            found = found_wrong(new, checks, self.policy)
            pooled, marked = self.db.withdraw(found, [(c[4], c[6]) for c in new])
            done = Withdrawal(tuple(found), pooled, marked)
            if found:
                self.taken, self.last = self.taken + 1, done
        self._stamp = stamp
        return done
