"""MQTT against a real broker (mosquitto, started here): alerts at QoS 1, the broker going away and coming back,
the last will, and Home Assistant discovery payloads checked against its documented schema."""

from __future__ import annotations

import json
import re
import time

import pytest

from edge_agent.alerts.config import AlertsSection, MqttSection
from edge_agent.alerts.homeassistant import discovery
from edge_agent.alerts.worker import AlertWorker
from edge_agent.results import ResultsDB

from .broker import Broker, Listener, needs_mosquitto
from .test_alerts import _result

pytestmark = needs_mosquitto

# Home Assistant's MQTT discovery, as its documentation and schemas state it (mqtt/schemas.py, sensor.py, event.py):
_TOPIC = re.compile(r"^(?P<prefix>[^#+]+)/(?P<component>sensor|event)/(?P<node>[a-zA-Z0-9_-]+)/(?P<object>[a-zA-Z0-9_-]+)/config$")
_COMMON = {"name", "unique_id", "state_topic", "availability_topic", "availability", "availability_mode", "device", "origin", "icon"}
_COMMON |= {
    "entity_category",
    "enabled_by_default",
    "qos",
    "encoding",
    "value_template",
    "json_attributes_topic",
    "json_attributes_template",
}
_COMMON |= {"object_id", "default_entity_id", "entity_picture", "device_class"}
_ALLOWED = {
    "sensor": _COMMON
    | {"unit_of_measurement", "state_class", "expire_after", "force_update", "last_reset_value_template", "suggested_display_precision"},
    "event": _COMMON | {"event_types"},
}
_REQUIRED = {"sensor": {"state_topic"}, "event": {"state_topic", "event_types"}}
_DEVICE = {
    "identifiers",
    "connections",
    "manufacturer",
    "model",
    "name",
    "hw_version",
    "serial_number",
    "sw_version",
    "via_device",
    "suggested_area",
    "configuration_url",
}


def ha_schema_problems(topic: str, payload: dict) -> list[str]:
    """What Home Assistant would refuse in one discovery message (empty: nothing)."""
    m = _TOPIC.match(topic)
    if not m:
        return [f"topic {topic} is not <prefix>/<component>/<node_id>/<object_id>/config"]
    comp, out = m["component"], []
    out += [f"missing {k}" for k in _REQUIRED[comp] - payload.keys()]
    out += [f"unknown key {k}" for k in payload.keys() - _ALLOWED[comp]]
    dev = payload.get("device", {})
    out += [f"unknown device key {k}" for k in dev.keys() - _DEVICE]
    if dev and not (dev.get("identifiers") or dev.get("connections")):
        out.append("device without identifiers or connections")
    if dev and "unique_id" not in payload:
        out.append("a device needs the entity's unique_id")
    if "origin" in payload and "name" not in payload["origin"]:
        out.append("origin without name")
    if payload.get("state_class") not in (None, "measurement", "total", "total_increasing"):
        out.append(f"state_class {payload['state_class']}")
    if payload.get("entity_category") not in (None, "config", "diagnostic"):
        out.append(f"entity_category {payload['entity_category']}")
    if comp == "event" and not (isinstance(payload.get("event_types"), list) and all(isinstance(e, str) for e in payload["event_types"])):
        out.append("event_types must be a list of strings")
    if any(c in payload.get("state_topic", "") for c in "#+"):
        out.append("state_topic has a wildcard")
    return out


def test_the_discovery_payloads_follow_home_assistants_documented_schema():
    msgs = discovery(MqttSection(host="x"), "green house#1", "0.1.0")
    assert {json.loads(p)["unique_id"] for _, p, _ in msgs} >= {"edge_agent_green_house_1_last_diagnosis", "edge_agent_green_house_1_alert"}
    for topic, payload, retain in msgs:
        assert retain and ha_schema_problems(topic, json.loads(payload)) == [], topic
    # the check itself refuses what Home Assistant refuses
    assert ha_schema_problems("homeassistant/sensor/a b/x/config", {"state_topic": "t"})
    assert ha_schema_problems("homeassistant/event/n/x/config", {"state_topic": "t", "event_types": "disease"})
    assert ha_schema_problems("homeassistant/sensor/n/x/config", {"state_topic": "t", "device": {"name": "d"}, "unique_id": "u"})
    assert ha_schema_problems("homeassistant/sensor/n/x/config", {"state_topic": "t", "colour": "red"})


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path)
    b.start()
    yield b
    b.stop()


def _worker(tmp_path, db, port, **mqtt):
    section = MqttSection(host="127.0.0.1", port=port, keepalive_s=5, **mqtt)
    return AlertWorker(AlertsSection(), section, [], db.path, tmp_path, "greenhouse", "0.1.0")


def test_alerts_results_state_and_discovery_reach_the_broker(tmp_path, broker):
    db = ResultsDB(tmp_path / "results.sqlite")
    heard = Listener(broker.port, ["edge-agent/#", "homeassistant/#"])
    w = _worker(tmp_path, db, broker.port)
    w.start()
    heard.wait(lambda: heard.on("edge-agent/greenhouse/available") == [b"online"])
    heard.wait(lambda: len([t for t, _, _ in heard.messages if t.startswith("homeassistant/")]) == 12)  # 10 sensors, 2 events
    _result(db, "Tomato___Late_blight")
    _result(db, "Tomato___Late_blight")
    _result(db, "Tomato___healthy")
    heard.wait(lambda: len(heard.on("edge-agent/greenhouse/result")) == 3)
    heard.wait(lambda: len(heard.on("edge-agent/greenhouse/alert")) == 1)
    result = json.loads(heard.on("edge-agent/greenhouse/result")[0])
    assert result["label"] == "Tomato___Late_blight" and result["taken"] is None  # no EXIF: when classified (time) only
    alert = json.loads(heard.on("edge-agent/greenhouse/alert")[0])
    assert alert["event_type"] == "disease" and alert["label"] == "Tomato___Late_blight"
    w.observe({"engine": {"engine_version": "v1000"}, "healthy": True})
    heard.wait(lambda: heard.on("edge-agent/greenhouse/state"))
    state = json.loads(heard.on("edge-agent/greenhouse/state")[-1])
    assert state["photos_today"] == 3 and state["alerts_today"] == 1 and state["last_diagnosis"] == "healthy (Tomato)"
    w.observe({"engine": {"engine_version": "v1001"}, "healthy": True})
    heard.wait(lambda: heard.on("edge-agent/greenhouse/engine"))
    swapped = json.loads(heard.on("edge-agent/greenhouse/engine")[0])  # what the Engine event entity reads
    assert swapped["event_type"] == "swapped" and swapped["to"] == "v1001"
    w.stop()
    heard.wait(lambda: heard.on("edge-agent/greenhouse/available")[-1] == b"offline")
    heard.close()
    db.close()


def test_the_broker_away_for_a_while_loses_no_alert(tmp_path, broker):
    db = ResultsDB(tmp_path / "results.sqlite")
    w = _worker(tmp_path, db, broker.port)
    w.start()
    assert w.mqtt.connected.wait(10)
    broker.stop()
    _result(db, "Tomato___Late_blight")
    _result(db, "Apple___Apple_scab")
    time.sleep(2.0)  # alerts raised while the broker is down stay in the outbox
    assert w.outbox.counts()["pending"] == {"mqtt": 2}
    broker.start()
    heard = Listener(broker.port, ["edge-agent/greenhouse/alert"])
    heard.wait(lambda: len(heard.on("edge-agent/greenhouse/alert")) == 2, timeout=60)
    assert sorted(json.loads(p)["label"] for p in heard.on("edge-agent/greenhouse/alert")) == ["Apple___Apple_scab", "Tomato___Late_blight"]
    assert w.outbox.counts()["pending"] == {}
    w.stop()
    heard.close()
    db.close()


def test_a_device_that_dies_is_marked_offline_by_its_last_will(tmp_path, broker):
    db = ResultsDB(tmp_path / "results.sqlite")
    heard = Listener(broker.port, ["edge-agent/greenhouse/available"])
    w = _worker(tmp_path, db, broker.port)
    w.start()
    heard.wait(lambda: heard.on("edge-agent/greenhouse/available") == [b"online"])
    w.mqtt.client._sock.close()  # the socket dies without a DISCONNECT: as a crash or a cut cable
    w.mqtt.client.loop_stop()
    heard.wait(lambda: heard.on("edge-agent/greenhouse/available")[-1:] == [b"offline"], timeout=30)
    heard.close()
    db.close()
