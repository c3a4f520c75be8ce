"""The ``[alerts]``, ``[mqtt]`` and ``[[webhooks]]`` sections: what deserves a notification, and where it goes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from engines.settings import Section

__all__ = ["ANY_DISEASE", "AlertsSection", "MqttSection", "WebhookSection"]

#: In ``[alerts] classes``: every class whose name does not end in ``healthy``.
ANY_DISEASE = "any-disease"


class AlertsSection(Section):
    enabled: bool = Field(True, description="Turn results into alerts by the rules below (kept on the page, sent where configured).")
    classes: list[str] = Field(
        [ANY_DISEASE], description=f"Classes that raise an alert; '{ANY_DISEASE}' means every class not named *healthy."
    )
    verdicts: list[Literal["confident", "unsure", "unknown"]] = Field(
        ["confident"], description="Verdicts that may raise an alert (confident: the model is sure)."
    )
    min_confidence: float = Field(0.0, ge=0.0, le=1.0, description="Lowest confidence that raises an alert.")
    grown_crops_only: bool = Field(
        True, description="Alert only for the crops grown here: [classify] crops, else those the expert has labelled (none known: all)."
    )
    quiet_period_s: float = Field(
        3600.0, ge=0.0, le=7 * 86400, description="After an alert, the same class on the same device stays quiet this long."
    )
    digest_at: str = Field("", description="Local time (HH:MM) of a daily digest of the day's alerts and results; empty: none.")
    link: str = Field("", description="The page's address as phones reach it (http://greenhouse.local:8080): alerts link to the photo.")
    queue_mb: int = Field(16, ge=1, le=4096, description="Disk kept for notifications not yet delivered (a dead broker or endpoint).")
    retry_max_s: float = Field(
        300.0, ge=1.0, le=86400, description="Longest wait between two delivery attempts (backoff doubles up to it)."
    )

    @field_validator("digest_at")
    @classmethod
    def _hh_mm(cls, value: str) -> str:
        if value:
            hh, _, mm = value.partition(":")
            if not (hh.isdigit() and mm.isdigit() and int(hh) < 24 and int(mm) < 60 and len(mm) == 2):
                raise ValueError("must be HH:MM (24-hour local time), e.g. 07:30, or empty for no digest")
        return value


class MqttSection(Section):
    host: str = Field("", description="MQTT broker host; empty: MQTT off.")
    port: int = Field(1883, ge=1, le=65535, description="MQTT broker port (8883 is usual with TLS).")
    prefix: str = Field("edge-agent", description="Topic prefix: <prefix>/<device>/result, /alert, /engine, /health, /available.")
    username: str = Field("", description="User name for the broker; empty: none.")
    password_file: str = Field("", description="File holding the broker password (kept out of the config file).")
    tls: bool = Field(False, description="Connect with TLS.")
    ca_file: str = Field("", description="CA certificate to verify the broker with; empty: the system's.")
    results_per_s: int = Field(
        10,
        ge=0,
        le=1000,
        description="Publish each result at QoS 0 on <prefix>/<device>/result, at most this many a second (a burst past "
        "it is skipped there; the API has every one); 0: none.",
    )
    discovery: bool = Field(True, description="Publish Home Assistant MQTT discovery, so the device appears with no YAML.")
    discovery_prefix: str = Field("homeassistant", description="Home Assistant's discovery prefix.")
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keep-alive; the broker declares the device offline after 1.5x this.")

    @field_validator("prefix", "discovery_prefix")
    @classmethod
    def _topic(cls, value: str) -> str:
        if not value or any(c in value for c in "#+\0") or value.startswith("/") or value.endswith("/"):
            raise ValueError("must be a topic prefix without '#', '+', or a leading or trailing '/'")
        return value


class WebhookSection(Section):
    url: str = Field(description="Where to POST each alert's JSON (http:// or https://).")
    secret_file: str = Field("", description="File holding the HMAC-SHA256 key that signs each body (X-Edge-Agent-Signature).")
    events: list[Literal["alert", "digest", "engine", "health"]] = Field(["alert", "digest"], description="What is sent.")
    format: Literal["json", "ntfy"] = Field(
        "json",
        description="json: the alert as JSON (its title, message and text fields suit Gotify and Slack too); ntfy: its "
        "message as text with Title and Tags headers.",
    )
    timeout_s: float = Field(10.0, gt=0, le=120, description="How long one POST may take.")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value
