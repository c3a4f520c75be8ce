"""The daily digest: one message a day of what the device saw (diseases, doubts, plants) and what it learnt from.

:class:`DigestRounds` is a part of :class:`edge_agent.alerts.worker.AlertWorker` (its ledger reads, rules, outbox and
the daemon's last status), kept in a module of its own beside it.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from collections.abc import Callable

from edge_agent.alerts.config import AlertsSection
from edge_agent.alerts.outbox import Outbox
from edge_agent.alerts.rules import AlertRules, Candidate
from edge_agent.class_notes import NotesSource
from edge_agent.names import class_phrase
from edge_agent.plants import diagnose
from edge_agent.results import missing_table

__all__ = ["DigestRounds"]


class DigestRounds:
    """The daily digest (a part of :class:`edge_agent.alerts.worker.AlertWorker`)."""

    section: AlertsSection
    device: str
    rules: AlertRules
    notes: NotesSource
    outbox: Outbox
    sure: float
    plant_max_photos: int
    num_classes: Callable[[], int]
    _observed: dict
    _digest_waits_until: float  # (time.monotonic) at most a minute after the worker's start
    _con: sqlite3.Connection | None
    _results: Callable[..., list[tuple]]
    _plant_photos: Callable[..., list]
    _messages: Callable[..., list]

    def digest_due(self, now: float | None = None) -> dict | None:
        """The day's digest once ``digest_at`` has passed today and none went out today, else None."""
        if not self.section.digest_at:
            return None
        now = time.time() if now is None else now
        day = dt.date.fromtimestamp(now)
        hh, mm = (int(x) for x in self.section.digest_at.split(":"))
        if now < dt.datetime.combine(day, dt.time(hh, mm)).timestamp() or self.outbox.get("digest_day") == day.isoformat():
            return None
        since = now - 86400
        rows = self._results(
            "SELECT label, COALESCE(verdict, 'confident'), COUNT(*) FROM results WHERE created >= ? AND created <= ? GROUP BY label, 2",
            (since, now),
        )
        counts: dict[str, int] = {}  # every answer by its best guess
        by_verdict = dict.fromkeys(("confident", "unsure", "unknown"), 0)
        seen: dict[str, int] = {}  # a class as said with a verdict that may alert: what the lines count
        for label, verdict, n in rows:
            counts[label] = counts.get(label, 0) + n
            by_verdict[verdict] = by_verdict.get(verdict, 0) + n
            if verdict in self.section.verdicts:
                seen[label] = seen.get(label, 0) + n
        alerts = self.outbox.alerts(since=since, limit=100000)
        diseased = {
            k: v
            for k, v in sorted(seen.items(), key=lambda kv: -kv[1])
            if self.rules.wants(Candidate(0, 0, "", k, 1.0, self.section.verdicts[0], "", ""))
        }
        lines = [f"{class_phrase(k)}: {v}{' (urgent)' if self._urgent(k) else ''}" for k, v in diseased.items()] or ["no disease seen"]
        doubts = [
            f"{by_verdict[v]} {said}"
            for v, said in (("unsure", "not sure"), ("unknown", "unlike any plant known"))
            if by_verdict[v] and v not in self.section.verdicts
        ]
        if doubts:  # answers the lines do not count as findings, apart: the expert's Review page has them
            lines.append(" and ".join(doubts) + " (ask an expert: the Review page)")
        plants, unsure = self._day_plants(since, now)
        if plants:
            lines.append("plants with a disease: " + ", ".join(f"{p} ({class_phrase(label)})" for p, label in plants.items()))
        if unsure:  # the trees to show the expert: their pages label their photos together
            lines.append("plants the model is not sure of: " + ", ".join(unsure) + " (ask an expert: the Plants page)")
        learning = self._day_learning(since, now)
        if learning["line"]:
            lines.append(learning.pop("line"))
        return {
            "event_type": "digest",
            "device": self.device,
            "day": day.isoformat(),
            "photos": sum(counts.values()),
            "alerts": len(alerts),
            "by_class": counts,
            "by_verdict": by_verdict,
            "plants": plants,
            "plants_unsure": unsure,
            "learning": {k: v for k, v in learning.items() if k != "line"},
            "title": f"edge-agent {self.device}: {sum(counts.values())} photos, {len(alerts)} alerts in the last 24 h",
            "message": "; ".join(lines),
            "text": "; ".join(lines),
        }

    def _day_plants(self, since: float, until: float, most: int = 200) -> tuple[dict[str, str], list[str]]:
        """The plants photographed from ``since`` to ``until`` whose diagnosis (the expert's label where the expert
        labelled any of that visit's photos, else its photos combined) is a disease the alert rules take (plant ->
        class), and those it leaves unsure or unknown (a folder of many plants is neither)."""
        out, unsure = {}, []
        for plant, last in self._results(
            "SELECT plant, MAX(id) FROM results WHERE plant IS NOT NULL AND created >= ? AND created <= ? GROUP BY plant LIMIT ?",
            (since, until, most),
        ):
            try:
                said = self._results(
                    "SELECT e.sha256, e.label FROM expert_labels e JOIN results r ON r.sha256 = e.sha256 WHERE r.plant = ?", (plant,)
                )
            except sqlite3.OperationalError as exc:
                if self._con is None or not missing_table(self._con, exc):
                    raise  # locked past the wait: the round fails and is tried again
                said = []  # a ledger older than the expert's labels
            d = diagnose(
                self._plant_photos(plant, last), self.num_classes(), self.sure, dict(said), self.plant_max_photos
            )  # that day's visit
            sure = 1.0 if d.expert else d.probability  # the expert's word is not a probability
            if d.verdict == "confident" and self.rules.wants(Candidate(0, 0, "", d.label, sure, "confident", "", "")):
                out[plant] = d.label
            elif d.verdict in ("unsure", "unknown") and not d.not_one:
                unsure.append(plant)
        return out, unsure

    def _day_learning(self, since: float, until: float) -> dict:
        """What the device learnt from between ``since`` and ``until``: the expert's labels, the pseudo-labels the
        trainer took (and kept), those taken back, the classes it learns from on its own (as the daemon's status last said), and the photos that
        wait for the expert now; ``line``: the digest's sentence of it (None where there is nothing to say)."""
        counts = []
        for sql, args in (
            ("SELECT COUNT(*) FROM expert_labels WHERE labelled >= ? AND labelled <= ?", (since, until)),
            ("SELECT COUNT(*) FROM pseudo_sent WHERE sent >= ? AND sent <= ? AND withdrawn IS NULL", (since, until)),
            ("SELECT COUNT(*) FROM pseudo_sent WHERE withdrawn >= ? AND withdrawn <= ?", (since, until)),
            ("SELECT COUNT(*) FROM label_queue WHERE kind = 'review'", ()),
        ):
            try:
                rows = self._results(sql, args)
            except sqlite3.OperationalError as exc:
                if self._con is None or not missing_table(self._con, exc):
                    raise  # locked past the wait: the round fails and is tried again
                rows = []  # a ledger from before that table
            counts.append(rows[0][0] if rows else 0)
        experts, pseudo, withdrawn, waiting = counts
        trusted = (self._observed or {}).get("trusted")
        said = [
            f"{n} {what}{'' if n == 1 else 's'}{tail}"
            for n, what, tail in (
                (experts, "expert label", ""),
                (pseudo, "pseudo-label", " to the trainer"),
                (withdrawn, "pseudo-label", " taken back (a sure answer of their class found wrong)"),
            )
            if n
        ]
        if trusted:
            said.append("learns on its own from " + ", ".join(class_phrase(label) for label in trusted))
        elif trusted is not None and (experts or waiting):
            said.append("learns from no class on its own yet")
        if waiting:
            said.append(f"{waiting} photo{' waits' if waiting == 1 else 's wait'} for the expert (the Review page)")
        return {
            "expert_labels": experts,
            "pseudo_labels": pseudo,
            "pseudo_labels_withdrawn": withdrawn,
            "learns_on_its_own": trusted,
            "review_waiting": waiting,
            "line": "learning: " + ", ".join(said) if said else None,
        }

    def _urgent(self, label: str) -> bool:
        """The class's notes say it cannot wait (late blight, citrus greening)."""
        note = self.notes.get(label)
        return bool(note and note.urgency)

    def _digest(self) -> None:
        if not self._observed and time.monotonic() < self._digest_waits_until:
            return  # the daemon's first status (the classes trusted) is seconds away: a digest due at the start waits
        body = self.digest_due()
        if body is not None:
            self.outbox.put(self._messages("digest", body))
            self.outbox.set("digest_day", body["day"])
