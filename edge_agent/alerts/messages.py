"""What is sent: the topics under ``[mqtt] prefix`` and the JSON of an alert, a result, an engine or health event."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from urllib.parse import quote

from edge_agent.alerts.rules import Candidate
from edge_agent.class_notes import ClassNote
from edge_agent.names import class_phrase, describe_class

__all__ = ["Topics", "alert_body", "diagnosis", "encode", "place_attributes", "result_body", "status_events"]


@dataclass(frozen=True)
class Topics:
    """``<prefix>/<device>/...``: one topic per kind of message."""

    prefix: str
    device: str

    def __getattr__(self, name: str) -> str:
        if name in ("result", "alert", "engine", "health", "available", "state", "digest"):
            level = re.sub(r"[#+/\x00]", "_", self.device)  # a device name is one topic level
            return f"{self.prefix}/{level}/{name}"
        raise AttributeError(name)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + time.strftime("%z", time.localtime(t))


def diagnosis(c: Candidate) -> str:
    """The answer in a few words, as sure as its verdict ("Late blight (Tomato)", "not sure: Late blight (Tomato)?")."""
    named = class_phrase(c.label)
    if c.verdict == "unknown":
        return f"not a plant it knows (best guess {named})"
    return named if c.verdict == "confident" else f"not sure: {named}?"


#: A photo taken this long (seconds) before it was classified (a card copied in days later) says so in its alert.
OLD_PHOTO_S = 6 * 3600


def _said(c: Candidate) -> tuple[str, str]:
    """(title, message) for people, as sure as the verdict is: only a confident answer is said as a finding; a photo
    taken well before it was classified says when (the disease was there then)."""
    plant, condition = describe_class(c.label)
    why = f": {c.reason}" if c.reason else ""
    where = f"{c.device}, plant {c.plant_name}" if c.plant_name else c.device  # the tree to walk to
    if c.taken is not None and c.created - c.taken > OLD_PHOTO_S:
        where += f" (photographed {time.strftime('%Y-%m-%d %H:%M', time.localtime(c.taken))})"
    if c.verdict == "confident":
        return f"{condition} seen on {where}", f"{condition} on {plant} ({c.confidence:.0%} sure), photo {c.photo_id} on {where}"
    if c.verdict == "unknown":
        return (
            f"A photo unlike any the model knows on {where}",
            f"Not a plant or disease the model knows{why} (best guess {condition} on {plant}): ask an expert, "
            f"photo {c.photo_id} on {where}",
        )
    return (
        f"Possibly {condition} on {where}",
        f"Possibly {condition} on {plant}, not sure{why} (best guess, {c.confidence:.0%}): ask an expert, photo {c.photo_id} on {where}",
    )


def place_attributes(c: Candidate) -> dict:
    """Where the photo was taken (EXIF GPS) as ``latitude`` and ``longitude``, the attributes by which Home Assistant's
    map card places an entity; both None where not known."""
    lat, lon = c.place or (None, None)
    return {"latitude": lat, "longitude": lon}


def _check(c: Candidate, note: ClassNote | None) -> tuple[str, str]:
    """(what to look for on the plant, why it cannot wait) from the class's notes, for an answer that names a disease
    (sure, or the best guess of one not sure); nothing for a photo unlike any the model knows."""
    if note is None or c.verdict == "unknown":
        return "", ""
    return note.look_for, note.urgency


def alert_body(c: Candidate, page: str = "", note: ClassNote | None = None) -> dict:
    """An alert's JSON: the class and what it means (``plant``: the crop; ``plant_name``: the farmer's plant, where
    the alert is a plant's), how sure, which photo, when (``time``: classified; ``taken``: photographed, where its EXIF
    says), where (``latitude``, ``longitude``: its photo's GPS, where its EXIF says); ``title`` / ``message`` / ``text``
    are for people (Gotify reads title and message, Slack text), worded as sure as the verdict; ``event_type`` is for
    Home Assistant; ``look_for`` and ``urgency`` are the class's notes (:mod:`edge_agent.class_notes`), told in the
    message too, so the farmer can check the plant from the phone's notification."""
    plant, condition = describe_class(c.label)
    title, message = _said(c)
    look_for, urgency = _check(c, note)
    if urgency:
        message += f"\nUrgent: {urgency}"
    if look_for:
        message += f"\n{'Look for' if c.verdict == 'confident' else f'If it is {condition}, look for'}: {look_for}"
    body = {
        "event_type": "disease",
        "alert_id": f"{c.device}-{c.result_id}",
        "device": c.device,
        "plant": plant,
        "condition": condition,
        **result_body(c),  # the class, how sure, which photo, when and where, as a result's message says them
        "title": title,
        "message": message,
        "text": message,
        "priority": (10 if urgency else 8) if c.verdict == "confident" else 5,  # Gotify's scale: 10 for what cannot wait
        "plant_name": c.plant_name,
        "look_for": look_for,
        "urgency": urgency,
    }
    if page:
        body["url"] = f"{page.rstrip('/')}/photo/{c.sha256}"
        body["class_url"] = f"{page.rstrip('/')}/classes/{quote(c.label)}"
        if c.plant_name:
            body["plant_url"] = f"{page.rstrip('/')}/plants/{quote(c.plant_name)}"
    return body


def result_body(c: Candidate) -> dict:
    """A result's JSON (published at QoS 0 on ``<prefix>/<device>/result``)."""
    return {
        "label": c.label,
        "confidence": round(c.confidence, 4),
        "verdict": c.verdict,
        "verdict_reason": c.reason,
        "photo_id": c.photo_id,
        "result_id": c.result_id,
        "time": _iso(c.created),
        "taken": None if c.taken is None else _iso(c.taken),
        **place_attributes(c),
    }


def encode(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


#: (status key, (event, title, message) when it starts, the same when it ends) for each trouble of the trainer a
#: device's alerts say: it stores no labels (they wait on the device), its disk has no room for a retrain.
_TRAINER_TROUBLES = (
    (
        "trainer_stuck",
        ("trainer_not_storing", "the trainer stores no labels", "{state}: the labels wait on this device and are sent again"),
        ("trainer_storing", "the trainer stores labels again", "the labels that waited are being sent"),
    ),
    (
        "trainer_no_room",
        (
            "trainer_waiting_for_room",
            "the trainer cannot retrain: its disk is full",
            "{state}: no new version until there is room on the trainer's disk; the labels wait there",
        ),
        ("trainer_room_again", "the trainer has room to retrain again", "the labels that waited are trained on"),
    ),
)


def status_events(device: str, before: dict, now: dict, errors: list[dict]) -> list[tuple[str, dict]]:
    """The engine and health events between two of the daemon's statuses (``engine``, ``refused``, ``healthy``,
    ``backup``: the schedule's failure or None, ``card_suspect``: files a backup found changed on the card without
    being written, or None, ``trainer_stuck`` / ``trainer_no_room``: the trainer's state while it
    stores no labels / has no room to retrain, or None; ``trusted``, ``withdrawals``, ``last_withdrawal``: the
    daemon's ``trust`` status), each with a ``title`` and ``message`` a phone shows (ntfy); an engine event's
    ``event`` is its ``event_type`` too, which Home Assistant's event entity reads."""
    head = f"edge-agent {device}"
    out: list[tuple[str, dict]] = []
    if now["engine"] != before["engine"]:
        said = {"title": f"{head}: now serving {now['engine']}", "message": f"swapped from {before['engine']} to {now['engine']}"}
        out.append(("engine", {"event": "swapped", "from": before["engine"], "to": now["engine"], "device": device} | said))
    for version, reason in now["refused"].items():
        if version not in before["refused"]:
            said = {"title": f"{head}: refused engine {version}", "message": str(reason)}
            out.append(("engine", {"event": "refused", "version": version, "reason": reason, "device": device} | said))
    if now["healthy"] != before["healthy"]:
        why = "; ".join(str(e.get("error", "")) for e in errors if e.get("error")) or "edge-agent status says what stopped"
        said = (
            {"title": f"{head}: healthy again", "message": "every part runs"}
            if now["healthy"]
            else {"title": f"{head}: unhealthy", "message": why}
        )
        out.append(("health", {"event": "healthy" if now["healthy"] else "unhealthy", "device": device, "errors": errors} | said))
    failed = now["backup"]
    if bool(failed) != bool(before["backup"]):  # a backup that could not be written, and the next that was
        if failed:
            said = {"title": f"{head}: backup failed", "message": f"{failed['error']} (tried again hourly)"}
            out.append(
                ("health", {"event": "backup_failed", "device": device, "error": failed["error"], "failing_since": failed["since"]} | said)
            )
        else:
            said = {"title": f"{head}: backups written again", "message": "the last backup was written"}
            out.append(("health", {"event": "backup_written", "device": device} | said))
    card = now.get("card_suspect")
    if card and card != before.get("card_suspect"):  # found by a backup: said once, when found
        said = {
            "title": f"{head}: its SD card is failing",
            "message": f"{len(card['files'])} files changed on it without being written (found by a backup): put a new card in "
            "soon (edge-agent backup, then edge-agent restore onto the new card)",
        }
        out.append(("health", {"event": "card_failing", "device": device, "files": card["files"]} | said))
    out += _trust_events(head, device, before, now)
    # The trainer's troubles, each said once when it starts (with the trainer's state) and once when it ends.
    for key, on, off in _TRAINER_TROUBLES:
        state = now.get(key)
        if bool(state) != bool(before.get(key)):
            event, title, message = on if state else off
            said = {"title": f"{head}: {title}", "message": message.format(state=state)}
            out.append(("health", {"event": event, "device": device} | ({"trainer_state": state} if state else {}) | said))
    return [(kind, body | {"event_type": body["event"]}) if kind == "engine" else (kind, body) for kind, body in out]


def _trust_events(head: str, device: str, before: dict, now: dict) -> list[tuple[str, dict]]:
    """The engine events of the device's own learning: a class that earned trust or lost it (its sure answers become
    pseudo-labels, or go to the expert again), and the pseudo-labels taken back (:mod:`edge_agent.review.withdraw`)."""
    out: list[tuple[str, dict]] = []
    was, is_ = before.get("trusted"), now.get("trusted")
    if was is not None and is_ is not None:
        for label in sorted(set(is_) - set(was)):
            said = {
                "title": f"{head}: learns from {class_phrase(label)} on its own",
                "message": "the expert's checks show its sure answers of it right: they become pseudo-labels (a few still checked)",
            }
            out.append(("engine", {"event": "trust_earned", "class": label, "device": device} | said))
        for label in sorted(set(was) - set(is_)):
            said = {
                "title": f"{head}: stopped learning from {class_phrase(label)} on its own",
                "message": "the expert found a sure answer of it wrong: its sure answers go to the expert again until right checks earn the trust back",
            }
            out.append(("engine", {"event": "trust_lost", "class": label, "device": device} | said))
    last = now.get("last_withdrawal")
    if last and now.get("withdrawals", 0) > before.get("withdrawals", 0):
        found = ", ".join(f"{class_phrase(label)} by {version}" for label, version in last["found"])
        n = last["returned_to_review"] + last["to_withdraw_from_trainer"]
        said = {
            "title": f"{head}: took back {n} pseudo-label{'' if n == 1 else 's'} ({found})",
            "message": f"the expert found that engine's sure answers of it wrong: {last['returned_to_review']} back in the review queue, "
            f"{last['to_withdraw_from_trainer']} withdrawn from the trainer",
        }
        out.append(("engine", {"event": "pseudo_labels_withdrawn", "device": device, **last} | said))
    return out
