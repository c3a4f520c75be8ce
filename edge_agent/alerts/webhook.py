"""POST alerts to a URL, signed: ``X-Edge-Agent-Signature: sha256=<hex>`` is the HMAC-SHA256, with the key in
``secret_file``, of ``<X-Edge-Agent-Timestamp>.<body>``, so a receiver can check who sent it and refuse replays.

A 2xx answer delivers the message; anything else leaves it in the outbox for the next attempt: a refused connection,
4xx and 5xx, a redirect (a POST is never followed: the body would not reach anyone), a malformed answer (a garbage
status line, a cut chunked body) and an endpoint that takes longer than ``timeout_s`` in all, however slowly it drips
bytes (a watchdog closes the connection at the deadline). ``format = "ntfy"`` sends the alert's message as text with
ntfy's Title, Tags and Priority headers instead of the JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import socket
import ssl
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from edge_agent.alerts.config import WebhookSection
from edge_agent.alerts.outbox import DeliveryError, Message, PartialDelivery
from edge_agent.capture_place import geo_uri
from edge_agent.names import printable

__all__ = ["Webhook", "signature", "shown_url"]


def shown_url(url: str) -> str:
    """``url`` as errors, logs, status and the page show it: scheme, host and port only (a webhook's path or query,
    a Slack or ntfy token, and any user:password are secrets, kept in the config file)."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}/..."


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The value of ``X-Edge-Agent-Signature`` for ``body`` sent at ``timestamp``."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _actions(doc: dict) -> dict[str, str]:
    """ntfy's Actions header: a "Map" button opening the phone's map app where the alert's photo was taken (its
    ``geo:`` link), where the alert says, and a "What to do" button opening its disease's page, where the alert links
    the page; none otherwise. JSON, as ntfy takes it, since a geo link holds a comma."""
    actions = []
    lat, lon = doc.get("latitude"), doc.get("longitude")
    if isinstance(lat, (int, float)) and isinstance(lon, (int, float)):
        actions.append({"action": "view", "label": "Map", "url": geo_uri(lat, lon)})
    if doc.get("class_url") and doc.get("look_for"):
        actions.append({"action": "view", "label": "What to do", "url": doc["class_url"]})
    return {"Actions": json.dumps(actions)} if actions else {}


def _ntfy_priority(kind: str, doc: dict) -> str:
    """ntfy's priority: ``urgent`` (through Do Not Disturb, on most phones) for a sure answer of a disease that cannot
    wait, ``high`` for any other sure answer, ``default`` for the rest."""
    if kind != "alert" or doc.get("verdict", "confident") != "confident":
        return "default"
    return "urgent" if doc.get("urgency") else "high"


class Webhook:
    """One ``[[webhooks]]`` entry as a destination named ``webhook:<n>``."""

    def __init__(self, section: WebhookSection, index: int) -> None:
        self.section = section
        self.name = f"webhook:{index}"
        self.where = shown_url(section.url)
        self.secret = b""
        if section.secret_file:
            try:
                self.secret = Path(section.secret_file).expanduser().read_bytes().strip()
            except OSError as exc:
                raise DeliveryError(f"[[webhooks]] {self.where}: secret_file {section.secret_file}: {exc.strerror}") from None
        self.last_error: str | None = None

    def _request(self, m: Message) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the POST for ``m``."""
        headers = {"User-Agent": "edge-agent", "X-Edge-Agent-Event": m.kind}
        body = m.payload
        if self.section.format == "ntfy":
            doc = json.loads(body)
            body = doc.get("message", "").encode()
            headers |= {
                "Title": doc.get("title", "edge-agent"),
                "Tags": "seedling,warning",
                "Priority": _ntfy_priority(m.kind, doc),
                **({"Click": doc["url"]} if doc.get("url") else {}),  # a tap on the notification opens the photo
                **_actions(doc),
            }
            headers = {k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()}  # header values are Latin-1 on the wire
        else:
            headers["Content-Type"] = "application/json"
        if self.secret:
            stamp = str(int(time.time()))
            headers |= {"X-Edge-Agent-Timestamp": stamp, "X-Edge-Agent-Signature": signature(self.secret, stamp, body)}
        return body, headers

    def _post(self, body: bytes, headers: dict[str, str]) -> None:
        """One POST, answered 2xx within ``timeout_s`` in all, else :class:`DeliveryError` saying what happened."""
        url, limit = urlsplit(self.section.url), self.section.timeout_s
        cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        kw = {"context": ssl.create_default_context()} if url.scheme == "https" else {}
        conn = cls(url.hostname or "", url.port, timeout=limit, **kw)
        late = threading.Event()

        def cut() -> None:  # the deadline: a socket read that drips one byte at a time never times out by itself
            late.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(limit, cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("POST", (url.path or "/") + (f"?{url.query}" if url.query else ""), body=body, headers=headers)
            resp = conn.getresponse()
            resp.read(65536)
            status, reason, where = resp.status, resp.reason, resp.getheader("Location", "")
            if late.is_set():  # cut at the deadline: the answer read may be a status line without its end
                raise TimeoutError
        except Exception as exc:  # noqa: BLE001 - refused, unreachable, timed out, a garbage answer: never fatal
            said = " ".join(printable(str(exc)).split())  # an endpoint's garbage, on one line, never raw
            timed_out = late.is_set() or isinstance(exc, TimeoutError)  # the socket's own timeout can fire before the watchdog
            why = f"no answer within {limit:g} s" if timed_out else f"{type(exc).__name__}: {said}"[:200]
            raise DeliveryError(f"{self.where}: {why}") from None
        finally:
            watchdog.cancel()
            conn.close()
        if 300 <= status < 400:
            raise DeliveryError(
                f"{self.where}: HTTP {status} (redirect to {shown_url(where) if where else '?'}): a POST is not followed and was not "
                "delivered; set the webhook's url to the address it names"
            )
        if not 200 <= status < 300:
            raise DeliveryError(f"{self.where}: HTTP {status} {printable(str(reason))[:100]}".rstrip())

    def send(self, messages: list[Message]) -> list[int]:
        """POST each message in turn; returns their ids. On the first failure, :class:`PartialDelivery` holds those
        that went before it."""
        done: list[int] = []
        for m in messages:
            try:
                self._post(*self._request(m))
            except DeliveryError as exc:
                self.last_error = str(exc)
                raise PartialDelivery(str(exc), done) from None
            done.append(m.id)
        self.last_error = None
        return done

    def close(self) -> None:
        pass
