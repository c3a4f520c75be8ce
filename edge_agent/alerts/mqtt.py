"""One connection to an MQTT broker: ``available`` with a last will, discovery and state on every (re)connect,
alerts at QoS 1 counted delivered only on the broker's PUBACK.

paho-mqtt runs the socket on its own thread and reconnects by itself (1 s doubling to 30 s); this class never
blocks the caller for longer than ``ack_timeout_s`` per message, and publishes nothing while disconnected (the
outbox keeps it). The password is read from ``[mqtt] password_file``, never from the config file.
"""

from __future__ import annotations

import threading
from pathlib import Path

from edge_agent.alerts.config import MqttSection
from edge_agent.alerts.messages import Topics
from edge_agent.alerts.outbox import DeliveryError, Message
from edge_agent.log import get_logger

__all__ = ["MqttLink"]


class MqttLink:
    """The ``mqtt`` destination."""

    name = "mqtt"
    ack_timeout_s = 5.0

    def __init__(self, section: MqttSection, device: str, on_connect=lambda: []) -> None:
        """``on_connect()`` returns ``(topic, payload, retain)`` to publish at once on every (re)connect."""
        import paho.mqtt.client as mqtt

        self.section = section
        self.topics = Topics(section.prefix, device)
        self.log = get_logger("alerts.mqtt", broker=f"{section.host}:{section.port}")
        self._on_connect_publish = on_connect
        self.connected = threading.Event()
        #: Successful connections so far: a new one means what waits in the outbox can go now, whatever its backoff.
        self.connects = 0
        self.last_error: str | None = None
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"edge-agent-{device}", clean_session=True)
        self.client.will_set(self.topics.available, "offline", qos=1, retain=True)
        if section.username:
            password = None
            if section.password_file:
                try:
                    password = Path(section.password_file).expanduser().read_text().strip()
                except OSError as exc:
                    raise DeliveryError(
                        f"[mqtt] password_file {section.password_file}: {exc.strerror}; fix the path or its permissions"
                    ) from None
            self.client.username_pw_set(section.username, password)
        if section.tls:
            self.client.tls_set(ca_certs=section.ca_file or None)
        self.client.reconnect_delay_set(1, 30)
        self.client.on_connect = self._connected
        self.client.on_disconnect = self._disconnected
        self.client.connect_async(section.host, section.port, section.keepalive_s)
        self.client.loop_start()

    def _connected(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.last_error = f"broker refused the connection: {reason_code}"
            self.log.warning("mqtt_refused", reason=str(reason_code))
            return
        client.publish(self.topics.available, "online", qos=1, retain=True)
        for topic, payload, retain in self._on_connect_publish():
            client.publish(topic, payload, qos=1, retain=retain)
        self.last_error = None
        self.connects += 1
        self.connected.set()
        self.log.info("mqtt_connected")

    def _disconnected(self, client, userdata, flags, reason_code, properties) -> None:
        if self.connected.is_set():
            self.log.warning("mqtt_disconnected", reason=str(reason_code))
        self.connected.clear()
        self.last_error = f"disconnected: {reason_code}"

    def live(self, topic: str, payload: bytes | str, retain: bool = False) -> None:
        """Publish now at QoS 0 if connected, else drop it (results and state: the next one replaces it)."""
        if self.connected.is_set():
            self.client.publish(topic, payload, qos=0, retain=retain)

    def send(self, messages: list[Message]) -> list[int]:
        """Publish each message and wait for its PUBACK; raises :class:`DeliveryError` at the first that fails."""
        if not self.connected.is_set():
            raise DeliveryError(f"MQTT broker {self.section.host}:{self.section.port} not connected ({self.last_error or 'connecting'})")
        done = []
        for m in messages:
            info = self.client.publish(m.topic, m.payload, qos=m.qos, retain=m.retain)
            try:
                info.wait_for_publish(self.ack_timeout_s)
            except (RuntimeError, ValueError) as exc:  # not queued: the connection dropped under it
                raise DeliveryError(f"MQTT publish to {m.topic} failed: {exc}") from None
            if not info.is_published():
                raise DeliveryError(f"MQTT broker did not acknowledge {m.topic} within {self.ack_timeout_s:g} s")
            done.append(m.id)
        return done

    def close(self) -> None:
        if self.connected.is_set():
            self.client.publish(self.topics.available, "offline", qos=1, retain=True).wait_for_publish(2.0)
        self.client.disconnect()
        self.client.loop_stop()
