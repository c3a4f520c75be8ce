"""Which results deserve an alert: the class, the verdict and confidence, the crops the farm grows, and the quiet period
per class and device.

A farm's crops are ``[classify] crops``, else the crops of the classes its expert has labelled (a class name begins
with its crop: ``Apple___Apple_scab``); with ``[alerts] grown_crops_only`` (the default) an answer naming another crop
raises no alert (measured in the field: most confident answers of a crop not grown there are wrong). Before any crop
is known, every crop alerts.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.alerts.config import ANY_DISEASE, AlertsSection
from edge_agent.names import is_disease

__all__ = ["AlertRules", "Candidate", "is_disease"]


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
    reason: str = ""  # why the verdict is what it is, in words (a photo's when not confident; a plant's always)
    plant_name: str | None = None  # the farmer's plant (inbox subfolder) whose visit the alert is about; None: one photo
    taken: float | None = None  # when its photo (a plant's: its visit's newest) was taken, from EXIF; None: not known
    place: tuple[float, float] | None = None  # (latitude, longitude) of its photo, from EXIF GPS; None: not known


class AlertRules:
    """``wants(c)``: the result matches the rules; ``quiet_until(last)``: when the next alert of that class may go."""

    def __init__(self, section: AlertsSection, crops: list[str] | tuple[str, ...] = ()) -> None:
        self.section = section
        self._classes = {c for c in section.classes if c != ANY_DISEASE}
        self._any_disease = ANY_DISEASE in section.classes
        self.configured_crops = set(crops)
        #: The crops the expert's labels name (refreshed by the alert worker).
        self.labelled_crops: set[str] = set()
        #: Results that matched every rule but named a crop not grown here.
        self.other_crop = 0

    @property
    def crops(self) -> set[str]:
        """The crops grown here as far as known: configured, else labelled by the expert (empty: not known yet)."""
        return self.configured_crops or self.labelled_crops

    def wants(self, c: Candidate) -> bool:
        s = self.section
        if not s.enabled or c.verdict not in s.verdicts or c.confidence < s.min_confidence:
            return False
        if not (c.label in self._classes or (self._any_disease and is_disease(c.label))):
            return False
        if s.grown_crops_only and self.crops and c.label.split("___")[0] not in self.crops:
            self.other_crop += 1
            return False
        return True

    def quiet(self, c: Candidate, last_alert: float | None) -> bool:
        """True while the class's last alert on this device is within the quiet period (one stamped after this photo, by a
        clock since set back, silences nothing)."""
        return last_alert is not None and 0 <= c.created - last_alert < self.section.quiet_period_s
