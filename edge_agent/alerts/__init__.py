"""Alerts: rules that pick the results worth a notification, an outbox on disk, MQTT (with Home Assistant discovery)
and signed webhooks as destinations. The daemon runs :class:`edge_agent.alerts.worker.AlertWorker`."""

__all__: list[str] = []
