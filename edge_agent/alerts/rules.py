"""Which results deserve an alert: the class, the verdict and confidence, and the quiet period per class and device."""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.alerts.config import ANY_DISEASE, AlertsSection

__all__ = ["AlertRules", "Candidate", "is_disease"]


def is_disease(label: str) -> bool:
    """True for a class that names a disease: every class whose name does not end in ``healthy``."""
    return not label.lower().rstrip("_ ").endswith("healthy")


@dataclass(frozen=True)
class Candidate:
    """A result as the rules read it."""

    result_id: int
    created: float
    device: str
    label: str
    confidence: float
    verdict: str
    photo_id: str
    sha256: str


class AlertRules:
    """``wants(c)``: the result matches the rules; ``quiet_until(last)``: when the next alert of that class may go."""

    def __init__(self, section: AlertsSection) -> None:
        self.section = section
        self._classes = {c for c in section.classes if c != ANY_DISEASE}
        self._any_disease = ANY_DISEASE in section.classes

    def wants(self, c: Candidate) -> bool:
        s = self.section
        if not s.enabled or c.verdict not in s.verdicts or c.confidence < s.min_confidence:
            return False
        return c.label in self._classes or (self._any_disease and is_disease(c.label))

    def quiet(self, c: Candidate, last_alert: float | None) -> bool:
        """True while the class's last alert on this device is within the quiet period."""
        return last_alert is not None and c.created - last_alert < self.section.quiet_period_s
