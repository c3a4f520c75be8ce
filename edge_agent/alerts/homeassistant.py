"""Home Assistant MQTT discovery: the device appears with its sensors, an alert event and an engine event, with no YAML.

Published retained on every (re)connect to ``<discovery_prefix>/<component>/edge_agent_<device>/<key>/config``
(Home Assistant's documented discovery topic), each entity reading the retained ``<prefix>/<device>/state`` JSON
or, for the events, ``<prefix>/<device>/alert`` and ``<prefix>/<device>/engine``; all share the ``available`` topic
the last will sets to offline.
"""

from __future__ import annotations

import json
import re

from edge_agent.alerts.config import MqttSection
from edge_agent.alerts.messages import Topics

__all__ = ["ENGINE_EVENTS", "SENSORS", "discovery", "node_id"]

#: key -> (name, value in the state JSON, extra discovery keys)
SENSORS = {
    "last_diagnosis": ("Last diagnosis", "last_diagnosis", {"icon": "mdi:leaf"}),
    "last_confidence": ("Last confidence", "last_confidence", {"unit_of_measurement": "%", "state_class": "measurement"}),
    "photos_today": ("Photos today", "photos_today", {"state_class": "total_increasing", "icon": "mdi:camera"}),
    "alerts_today": ("Alerts today", "alerts_today", {"state_class": "total_increasing", "icon": "mdi:alert"}),
    "engine_version": ("Engine version", "engine_version", {"entity_category": "diagnostic", "icon": "mdi:chip"}),
    "queue_depth": ("Label queue", "queue_depth", {"entity_category": "diagnostic", "state_class": "measurement"}),
    "review_waiting": (
        "Waiting for the expert",
        "review_waiting",
        {"unit_of_measurement": "photos", "state_class": "measurement", "icon": "mdi:account-question"},
    ),
    "last_backup": (
        "Last backup",
        "last_backup",
        {"device_class": "timestamp", "entity_category": "diagnostic", "icon": "mdi:backup-restore"},
    ),
    "learns_on_its_own": (  # unknown until the daemon has read the expert's checks, and with [labels] trust_checks = 0
        "Learns on its own",
        "learns_on_its_own",
        {
            "unit_of_measurement": "classes",
            "icon": "mdi:school",
            "json_attributes_template": "{{ {'classes': value_json.learns_on_its_own_classes} | tojson }}",
        },
    ),
    "next_version_labels": (  # unknown where no trainer runs on the device's state directory (a fleet's trainer)
        "Labels before the next version",
        "next_version_labels",
        {
            "unit_of_measurement": "labels",
            "icon": "mdi:progress-clock",
            "json_attributes_template": "{{ {'waits_for': value_json.next_version_waits_for} | tojson }}",
        },
    ),
}

#: The ``event`` of each message on the engine topic (:func:`edge_agent.alerts.messages.status_events`).
ENGINE_EVENTS = ["swapped", "refused", "trust_earned", "trust_lost", "pseudo_labels_withdrawn"]


def node_id(device: str) -> str:
    """The device's id in discovery topics and unique ids (letters, digits, _ and - only)."""
    return "edge_agent_" + re.sub(r"[^a-zA-Z0-9_-]", "_", device)


def discovery(section: MqttSection, device: str, version: str) -> list[tuple[str, bytes, bool]]:
    """``(topic, payload, retain)`` for every entity of this device."""
    topics, node = Topics(section.prefix, device), node_id(device)
    dev = {
        "identifiers": [node],
        "name": f"edge-agent {device}",
        "manufacturer": "edge-agent",
        "model": "plant disease recogniser",
        "sw_version": version,
    }
    common = {"availability_topic": topics.available, "device": dev, "origin": {"name": "edge-agent", "sw_version": version}}
    out = []
    for key, (name, field, extra) in SENSORS.items():
        payload = {
            "name": name,
            "unique_id": f"{node}_{key}",
            "state_topic": topics.state,
            "value_template": "{{ value_json.%s }}" % field,
            **extra,
            **common,
        }
        if key == "last_diagnosis" or "json_attributes_template" in extra:
            payload["json_attributes_topic"] = topics.state
        out.append((f"{section.discovery_prefix}/sensor/{node}/{key}/config", json.dumps(payload).encode(), True))
    event = {
        "name": "Disease alert",
        "unique_id": f"{node}_alert",
        "state_topic": topics.alert,
        "event_types": ["disease"],
        "icon": "mdi:sprout",
        **common,
    }
    out.append((f"{section.discovery_prefix}/event/{node}/alert/config", json.dumps(event).encode(), True))
    engine = {
        "name": "Engine event",
        "unique_id": f"{node}_engine",
        "state_topic": topics.engine,
        "event_types": ENGINE_EVENTS,
        "icon": "mdi:chip",
        **common,
    }
    out.append((f"{section.discovery_prefix}/event/{node}/engine/config", json.dumps(engine).encode(), True))
    return out
