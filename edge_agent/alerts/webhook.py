"""POST alerts to a URL, signed: ``X-Edge-Agent-Signature: sha256=<hex>`` is the HMAC-SHA256, with the key in
``secret_file``, of ``<X-Edge-Agent-Timestamp>.<body>``, so a receiver can check who sent it and refuse replays.

A 2xx answer delivers the message; anything else (a refused connection, a timeout, 4xx, 5xx) leaves it in the outbox
for the next attempt. ``format = "ntfy"`` sends the alert's message as text with ntfy's Title, Tags and Priority
headers instead of the JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from edge_agent.alerts.config import WebhookSection
from edge_agent.alerts.outbox import DeliveryError, Message

__all__ = ["Webhook", "signature"]


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The value of ``X-Edge-Agent-Signature`` for ``body`` sent at ``timestamp``."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class Webhook:
    """One ``[[webhooks]]`` entry as a destination named ``webhook:<n>``."""

    def __init__(self, section: WebhookSection, index: int) -> None:
        self.section = section
        self.name = f"webhook:{index}"
        self.secret = b""
        if section.secret_file:
            try:
                self.secret = Path(section.secret_file).expanduser().read_bytes().strip()
            except OSError as exc:
                raise DeliveryError(f"[[webhooks]] {section.url}: secret_file {section.secret_file}: {exc.strerror}") from None
        self.last_error: str | None = None

    def _request(self, m: Message) -> urllib.request.Request:
        headers = {"User-Agent": "edge-agent", "X-Edge-Agent-Event": m.kind}
        body = m.payload
        if self.section.format == "ntfy":
            doc = json.loads(body)
            body = doc.get("message", "").encode()
            headers |= {
                "Title": doc.get("title", "edge-agent"),
                "Tags": "seedling,warning",
                "Priority": "high" if m.kind == "alert" else "default",
            }
            headers = {k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()}  # header values are Latin-1 on the wire
        else:
            headers["Content-Type"] = "application/json"
        if self.secret:
            stamp = str(int(time.time()))
            headers |= {"X-Edge-Agent-Timestamp": stamp, "X-Edge-Agent-Signature": signature(self.secret, stamp, body)}
        return urllib.request.Request(self.section.url, data=body, headers=headers, method="POST")

    def send(self, messages: list[Message]) -> list[int]:
        done = []
        for m in messages:
            try:
                with urllib.request.urlopen(self._request(m), timeout=self.section.timeout_s) as resp:
                    resp.read(65536)
            except urllib.error.HTTPError as exc:
                self.last_error = f"{self.section.url}: HTTP {exc.code}"
                raise DeliveryError(self.last_error) from None
            except (OSError, ValueError) as exc:  # refused, unreachable, timed out, a bad URL
                self.last_error = f"{self.section.url}: {getattr(exc, 'reason', exc)}"
                raise DeliveryError(self.last_error) from None
            done.append(m.id)
        self.last_error = None
        return done

    def close(self) -> None:
        pass
