"""The daemon's alert thread: reads new results from the ledger, raises alerts by the rules, delivers the outbox.

Each destination (the MQTT broker, each webhook) is delivered by its own thread, so one that hangs, drips or
answers garbage holds back only its own messages, and those wait in the outbox until it answers again.

It reads the results table from its own cursor (kept in ``alerts.sqlite``), so classification never waits on it and
a restart neither misses a result nor alerts twice: an alert, its messages and the cursor move in one transaction.
The first start on an existing ledger begins at its end (history raises no alerts). The daemon also hands it its
status every few seconds (:meth:`observe`): an engine swap, a refused version or a change of health becomes an
event, and the device's state (last diagnosis, photos today, ...) is published retained for Home Assistant.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from edge_agent.alerts._digest import DigestRounds
from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
from edge_agent.alerts.homeassistant import discovery
from edge_agent.alerts.messages import Topics, alert_body, diagnosis, encode, place_attributes, result_body, status_events
from edge_agent.alerts.outbox import DeliveryError, Outbox
from edge_agent.alerts.rules import AlertRules, Candidate
from edge_agent.backup import last_backup
from edge_agent.capture_place import Place, place_of
from edge_agent.class_notes import NotesSource
from edge_agent.ledger_rows import LedgerColumns
from edge_agent.log import get_logger
from edge_agent.names import class_phrase
from edge_agent.plants import combine, not_one_plant, visit_of
from edge_agent.results import missing_table
from edge_agent.review.queue import today
from edge_agent.worker import Worker, spawn
from engines.durable import connect_readonly

__all__ = ["AlertWorker"]


class _PlantPhoto(NamedTuple):
    """A plant's photo as :func:`~edge_agent.plants.diagnose` reads it."""

    sha256: str
    top_k: list
    verdict: str
    when: float  # edge_agent.ledger_rows.ResultRow.when
    result_id: int
    place: Place | None = None  # where it was taken (edge_agent.capture_place)


class AlertWorker(DigestRounds, Worker):
    thread_name = "alerts"
    poll_s = 0.2
    #: The retained state is published when it changes, and unchanged at most this often (a heartbeat).
    state_heartbeat_s = 60.0
    wait_s = 30.0  # how long a read of the results ledger waits while the daemon holds it locked

    def __init__(
        self,
        alerts: AlertsSection,
        mqtt: MqttSection,
        webhooks: list[WebhookSection],
        results_db: Path,
        state_dir: Path,
        device: str,
        version: str = "",
        crops: list[str] | tuple[str, ...] = (),
        num_classes: Callable[[], int] = lambda: 38,
        sure: float = 0.9,
        start_after: int | None = None,
        plant_max_photos: int = 0,
        visit_gap_s: float = 0,
        notes: NotesSource | None = None,
    ) -> None:
        """``num_classes``: how many classes the engine in service has; ``sure``: [labels] pseudo_threshold (a plant's
        combined diagnosis, :mod:`edge_agent.plants`, uses both); ``plant_max_photos``: [classify]'s (a folder of more
        photos in a visit alerts photo by photo); ``visit_gap_s``: [classify] plant_visit_gap_h in seconds (0: every
        photo of a plant one visit); ``notes``: what to look for and why it cannot wait, told in each alert (None: the
        shipped notes); ``start_after``: on the first start (no cursor
        yet), the last result not to alert on (default: the newest now), so a daemon that started classifying before
        the worker misses none of its own results."""
        super().__init__()
        self.section, self.device = alerts, device
        self.num_classes, self.sure, self.plant_max_photos, self.visit_gap_s = num_classes, sure, plant_max_photos, visit_gap_s
        self._not_plants: set[str] = set()  # folders found past plant_max_photos (logged once each)
        self.rules = AlertRules(alerts, crops)
        self.notes = notes if notes is not None else NotesSource()
        self._crops_read = 0.0
        self.results_db = Path(results_db)
        self.state_dir = Path(state_dir)
        self.outbox = Outbox(Path(state_dir) / "alerts.sqlite", alerts.queue_mb << 20, alerts.retry_max_s)
        self.log = get_logger("alerts", device=device)
        if self.outbox.recovered:
            self.log.warning("alerts_outbox_recovered", file=str(self.outbox.path), what=self.outbox.recovered)
        self.topics = Topics(mqtt.prefix, device)
        self._state: dict = {}
        self._state_lock = threading.Lock()
        self._observed: dict = {}
        self._digest_waits_until = time.monotonic() + 60.0
        self._next_try: dict[str, float] = {}
        self._failing: dict[str, str] = {}
        self._connects: dict[str, int] = {}
        self.destinations: list = []
        self._couriers: list[threading.Thread] = []
        self._state_sent: list = []
        self._state_sent_at = 0.0
        self.mqtt = None
        if mqtt.host:
            from edge_agent.alerts.mqtt import MqttLink

            disc = discovery(mqtt, device, version) if mqtt.discovery else []
            self.mqtt = MqttLink(mqtt, device, on_connect=lambda: disc + self._retained_state())
            self.destinations.append(self.mqtt)
        self.results_per_s = mqtt.results_per_s
        self._live = (0.0, 0)  # (second, results published in it)
        self._last_alert: dict[tuple[str, str], float | None] = {}
        from edge_agent.alerts.webhook import Webhook

        self.webhooks = [(Webhook(w, i), set(w.events)) for i, w in enumerate(webhooks)]
        self.destinations += [w for w, _ in self.webhooks]
        self._con: sqlite3.Connection | None = None
        self._con_lock = threading.Lock()
        self._ledger = LedgerColumns(self._results)  # the results table's columns (the daemon adds the newest)
        if not self.outbox.get("cursor"):
            self.outbox.set("cursor", str(self._max_result_id() if start_after is None else start_after))

    # ---- reading results -----------------------------------------------------------
    def _results(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._con_lock:  # the alert thread and the daemon's status loop share the connection
            if self._con is None:
                if not self.results_db.exists():
                    return []
                self._con = connect_readonly(self.results_db, self.wait_s)
            return self._con.execute(sql, args).fetchall()

    def _max_result_id(self) -> int:
        rows = self._results("SELECT COALESCE(MAX(id), 0) FROM results")
        return rows[0][0] if rows else 0

    def _messages(self, kind: str, body: dict) -> list[tuple[str, str, str, bytes, int, bool]]:
        """The outbox rows for one event: MQTT at QoS 1 (alerts, digests, engine and health events), each webhook that asked for the kind."""
        payload = encode(body)
        out = []
        if self.mqtt is not None:
            out.append(("mqtt", kind, getattr(self.topics, "alert" if kind == "alert" else kind), payload, 1, False))
        out += [(w.name, kind, w.section.url, payload, 1, False) for w, kinds in self.webhooks if kind in kinds]
        return out

    def _labelled_crops(self) -> None:
        """The crops of the classes the expert has labelled, read again at most once a minute."""
        if time.monotonic() - self._crops_read < 60 and self._crops_read:
            return
        self._crops_read = time.monotonic()
        try:
            rows = self._results("SELECT DISTINCT label FROM expert_labels")
        except sqlite3.OperationalError as exc:
            if self._con is not None and not missing_table(self._con, exc):  # locked past the wait: keep what was known
                self._crops_read = 0.0  # and ask again at the next scan
                self.log.warning("alerts_ledger_unreadable", file=str(self.results_db), error=str(exc))
                return
            rows = []  # a ledger from before expert_labels existed
        self.rules.labelled_crops = {str(label).split("___")[0] for (label,) in rows if label}

    def scan(self) -> int:
        """Turn results past the cursor into alerts (and live MQTT results); returns how many results were read."""
        self._labelled_crops()
        cursor = int(self.outbox.get("cursor", "0"))
        rows = self._results(
            "SELECT id, created, label, confidence, COALESCE(verdict, 'confident'), photo_id, sha256, plant,"
            f" {self._reason_column()}, {', '.join(map(self._ledger.or_null, ('taken', 'lat', 'lon')))} FROM results"
            " WHERE id > ? ORDER BY id LIMIT 500",
            (cursor,),
        )
        for row in rows:
            c = Candidate(
                row[0], row[1], self.device, row[2], row[3], row[4], row[5], row[6], row[8], taken=row[9], place=place_of(*row[10:12])
            )
            if self.mqtt is not None and self._may_publish_result():
                self.mqtt.live(self.topics.result, encode(result_body(c)))
            plant = row[7]
            # a plant's photo: the diagnosis of the plant's visit so far decides, once per plant, visit and class
            a, once = (c, None) if plant is None else self._as_plant(c, plant)
            if a is not None and self.rules.wants(a) and not self.rules.quiet(a, self._last_alert_of(a)):
                self.outbox.record(
                    a, self._messages("alert", alert_body(a, self.section.link, self.notes.get(a.label))), cursor=a.result_id
                )
                self._last_alert[(a.label, a.device)] = a.created
                if once is not None:
                    self.outbox.set(once, "1")
                self.log.info("alert", label=a.label, confidence=round(a.confidence, 3), photo_id=a.photo_id, plant=plant)
        if rows:  # the state shows the newest result only
            with self._state_lock:
                self._state |= {"last_diagnosis": diagnosis(c), "last_label": c.label, "last_verdict_reason": c.reason}
                self._state |= {"last_confidence": round(100 * c.confidence, 1), "last_verdict": c.verdict, "last_photo_id": c.photo_id}
                self._state |= place_attributes(c)  # Home Assistant's map card places the Last diagnosis sensor by them
                note = self.notes.get(c.label) if c.verdict != "unknown" else None
                self._state["last_look_for"] = note.look_for if note else ""  # the Last diagnosis sensor's attribute: how to check
            self.outbox.set("cursor", str(rows[-1][0]))
        return len(rows)

    def _reason_column(self) -> str:
        """The ledger's column of verdict reasons, or an empty string where a ledger from before 2026-12 has none."""
        return "COALESCE(verdict_reason, '')" if self._ledger.has("verdict_reason") else "''"

    def _as_plant(self, c: Candidate, plant: str) -> tuple[Candidate | None, str | None]:
        """``c`` as the diagnosis of its plant's visit (:func:`~edge_agent.plants.visits`) from its photos so far, and
        the outbox key that marks the alert raised (None once the plant alerted for that class in this visit); ``c``
        itself from a visit that is no plant (:func:`~edge_agent.plants.not_one_plant`: more than ``plant_max_photos``
        photos, or taken far apart): its photos alert one by one."""
        limit = self.plant_max_photos
        photos = self._plant_photos(plant, c.result_id)
        if why := not_one_plant([p.place for p in photos], limit):
            if plant not in self._not_plants:  # logged once
                self._not_plants.add(plant)
                self.log.warning("folder_not_a_plant", plant=plant, why=why, fix="one folder a tree, or raise [classify] plant_max_photos")
            return c, None
        d = combine([(r.top_k, r.verdict) for r in photos], self.num_classes(), self.sure)
        once = f"plant-alerted:{plant}:{min(p.result_id for p in photos)}:{d.label}"  # the visit: its first result
        if self.outbox.get(once):
            return None, None
        reason = f"a plant of {d.photos} photo{'s' * (d.photos != 1)}: {d.reason}"
        newest = max(p.when for p in photos)  # when taken where known, else classified (not after c.created)
        taken = newest if newest < c.created else c.taken
        return replace(c, label=d.label, confidence=d.probability, verdict=d.verdict, reason=reason, plant_name=plant, taken=taken), once

    def _plant_photos(self, plant: str, up_to: int) -> list[_PlantPhoto]:
        """``plant``'s photos of the visit that holds result ``up_to``, of those classified up to it, oldest first
        (:attr:`~edge_agent.ledger_rows.ResultRow.when`); at most ``plant_max_photos`` + 1, enough to tell a folder of more
        from a plant, read around it in time (not a large folder's every photo at each of its photos)."""
        when = self._ledger.when
        found = self._results(f"SELECT {when} FROM results WHERE id = ? AND plant = ?", (up_to, plant))
        if not found:
            return []
        most = f" LIMIT {self.plant_max_photos + 1}" if self.plant_max_photos else ""
        side = f"SELECT id, {when} FROM results WHERE plant = ? AND id <= ? AND ({when}, id) {{}} (?, ?) ORDER BY {when} {{}}, id {{}}"
        args = (plant, up_to, found[0][0], up_to)
        before = self._results(side.format("<", "DESC", "DESC") + most, args)
        times = [*reversed(before), (up_to, found[0][0]), *self._results(side.format(">", "ASC", "ASC") + most, args)]
        ids = [times[i][0] for i in visit_of([t for _, t in times], len(before), self.visit_gap_s)]  # past an end: too many
        if self.plant_max_photos:
            ids = ids[: self.plant_max_photos + 1]
        marks = ",".join("?" * len(ids))
        lat, lon = self._ledger.or_null("lat"), self._ledger.or_null("lon")
        rows = self._results(
            f"SELECT sha256, top_k, COALESCE(verdict, 'unsure'), {when}, id, {lat}, {lon} FROM results WHERE id IN ({marks})", tuple(ids)
        )
        photos = (_PlantPhoto(sha, json.loads(k), v, t, i, place_of(la, lo)) for sha, k, v, t, i, la, lo in rows)
        return sorted(photos, key=lambda p: (p.when, p.result_id))

    def _last_alert_of(self, c: Candidate) -> float | None:
        """When this class last raised an alert on this device (the ledger read once per class, then kept)."""
        key = (c.label, c.device)
        if key not in self._last_alert:
            self._last_alert[key] = self.outbox.last_alert(c.label, c.device)
        return self._last_alert[key]

    def _may_publish_result(self) -> bool:
        """Whether this second still has room under ``[mqtt] results_per_s``."""
        second = int(time.monotonic())
        n = self._live[1] + 1 if self._live[0] == second else 1
        self._live = (second, n)
        return n <= self.results_per_s

    # ---- delivering --------------------------------------------------------------
    def deliver(self) -> None:
        """One round for every destination, in turn (the running worker gives each its own thread instead)."""
        for d in self.destinations:
            self.deliver_to(d)

    def deliver_to(self, d) -> bool:
        """Send what is due to ``d``; a failure leaves it in the outbox for a later, backed-off try. Returns whether
        anything was sent."""
        connects = getattr(d, "connects", None)  # the broker is back: retry at once, not after the backoff
        if connects is not None and connects != self._connects.get(d.name, 0):
            self._connects[d.name] = connects
            self._next_try.pop(d.name, None)
            self.outbox.retry_now(d.name)
        if time.monotonic() < self._next_try.get(d.name, 0.0):  # not the wall clock: a clock set back holds nothing
            return False
        due = self.outbox.due(d.name)
        if not due:
            return False
        try:
            ids = d.send(due)
        except DeliveryError as exc:
            done = getattr(exc, "done", [])
            if done:
                self.outbox.delivered(done, d.name)
            wait = self.outbox.failed([m.id for m in due if m.id not in set(done)], d.name, str(exc))
            self._next_try[d.name] = time.monotonic() + wait
            if self._failing.get(d.name) != str(exc):
                self.log.warning("alert_delivery_failed", destination=d.name, error=str(exc), pending=len(due), retry_in_s=round(wait, 1))
            self._failing[d.name] = str(exc)
            return bool(done)
        self.outbox.delivered(ids, d.name)
        if self._failing.pop(d.name, None):
            self.log.info("alert_delivery_recovered", destination=d.name)
        return True

    def _courier(self, d) -> None:
        """One destination's thread: a hung or broken endpoint holds back only its own messages."""
        while not self._stop.is_set():
            try:
                sent = self.deliver_to(d)
            except Exception as exc:  # noqa: BLE001 - a locked disk or a destination's bug: log, wait, go on
                self.log.warning("alert_delivery_round_failed", destination=d.name, error=repr(exc)[:300])
                self.renew_if_damaged(exc)
                sent = False
            if not sent:
                self._stop.wait(self.poll_s)

    # ---- the daemon's status -------------------------------------------------------
    def observe(self, status: dict) -> None:
        """Called with the daemon's status: engine swaps, refusals and health changes become events; state is published."""
        engine = status.get("engine", {}).get("engine_version")
        refused = dict((status.get("hotswap") or {}).get("refused") or {})
        healthy = status.get("healthy")
        backup_failed = (status.get("backup") or {}).get("failed") or None
        card = (status.get("backup") or {}).get("card_suspect") or None
        handoff = status.get("handoff") or {}
        if handoff.get("trainer_alive"):  # a trainer that stores no labels (they wait here), or cannot retrain for want of room
            trainer = handoff.get("trainer") or {}
            stuck = trainer.get("state") if trainer.get("stores_labels") is False else None
            no_room = trainer.get("state") if trainer.get("waits_for_room") is True else None
        else:  # a silent one is no news
            stuck, no_room = ((self._observed or {}).get(k) for k in ("trainer_stuck", "trainer_no_room"))
        now = {
            "engine": engine,
            "refused": refused,
            "healthy": healthy,
            "backup": backup_failed,
            "card_suspect": card,
            "trainer_stuck": stuck,
            "trainer_no_room": no_room,
            **(status.get("trust") or {}),
        }
        before, self._observed = self._observed, now
        if before:
            events = status_events(self.device, before, self._observed, status.get("last_errors", [])[-3:])
            for kind, body in events:
                self.outbox.put(self._messages(kind, body | {"time": time.time()}))
        if self.mqtt is None:  # the device's state is published for Home Assistant only
            return
        start, end = today()
        trusted = (status.get("trust") or {}).get("trusted")  # the classes that make pseudo-labels; None: not yet read
        nxt = status.get("next_publish") or {}  # what the next version waits for (a trainer on this state directory)
        photos = self._results("SELECT COUNT(*) FROM results WHERE created >= ? AND created < ?", (start, end))
        queued = self._results("SELECT kind = 'review', COUNT(*) FROM label_queue GROUP BY 1")
        with self._state_lock:
            self._state |= {
                "photos_today": photos[0][0] if photos else 0,
                "alerts_today": self.outbox.alerts_since(start, end),
                "engine_version": engine,
                "queue_depth": sum(n for _, n in queued),
                "review_waiting": sum(n for review, n in queued if review),
                "healthy": bool(healthy),
                "last_backup": _when(last_backup(self.state_dir)),
                "learns_on_its_own": None if trusted is None else len(trusted),
                "learns_on_its_own_classes": None if trusted is None else [class_phrase(label) for label in trusted],
                "next_version_labels": nxt.get("expert_labels_needed"),
                "next_version_waits_for": nxt.get("sentence"),
            }
        now = time.monotonic()
        state = self._retained_state()
        if state != self._state_sent or now - self._state_sent_at >= self.state_heartbeat_s:  # on change, else a heartbeat
            for topic, payload, retain in state:
                self.mqtt.live(topic, payload, retain)
            self._state_sent, self._state_sent_at = state, now

    def _retained_state(self) -> list[tuple[str, bytes, bool]]:
        with self._state_lock:
            return [(self.topics.state, encode(self._state), True)] if self._state else []

    def renew_if_damaged(self, exc: BaseException) -> None:
        """A damaged page of the outbox: a new outbox, its cursor at the ledger's end (:meth:`Outbox.renew_if_damaged`)."""
        if self.outbox.renew_if_damaged(exc):
            self.outbox.set("cursor", str(self._max_result_id()))
            self.log.warning("alerts_outbox_recovered", file=str(self.outbox.path), what=self.outbox.recovered)

    # ---- the thread ----------------------------------------------------------------
    def _run(self) -> None:
        self._couriers = [spawn(lambda d=d: self._courier(d), f"alerts-{d.name}"[:15]) for d in self.destinations]
        while not self._stop.is_set():
            try:
                busy = self.scan()
                self._digest()
            except sqlite3.Error as exc:  # a locked or full disk: try again next round, nothing moved
                self.log.warning("alerts_round_failed", error=repr(exc))
                self.renew_if_damaged(exc)
                busy = 0
            if not busy:
                self._stop.wait(self.poll_s)

    def status(self) -> dict:
        out = self.outbox.counts()
        out["crops"] = sorted(self.rules.crops)
        out["skipped_other_crop"] = self.rules.other_crop
        out["destinations"] = {d.name: {"error": getattr(d, "last_error", None)} for d in self.destinations}
        if self.mqtt is not None:
            out["destinations"]["mqtt"]["connected"] = self.mqtt.connected.is_set()
        return out

    def stop(self) -> None:
        super().stop()
        for t in self._couriers:  # a POST in flight ends by its own deadline
            t.join(timeout=self.join_timeout_s)
        for d in self.destinations:
            d.close()
        self.outbox.close()
        if self._con is not None:
            self._con.close()


def _when(backup: dict | None) -> str | None:
    """When ``backup`` was taken, as Home Assistant's timestamp sensors read it (ISO 8601 with its zone), or None."""
    return dt.datetime.fromtimestamp(backup["time"], dt.timezone.utc).isoformat(timespec="seconds") if backup else None
