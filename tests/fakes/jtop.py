"""Fake ``jtop`` client of jetson-stats (4.2+ and 7.x; jtop/jtop.py, jtop/core/power.py, nvpmodel.py,
jetson_clocks.py of jetson_stats 7.2.2).

- ``jtop(interval=1.0)`` is a context manager; entering fails with ``JtopException`` when the
  jtop service is not running. A thread delivers a new sample every ``interval`` seconds and
  calls each observer registered with ``attach(observer)`` as ``observer(jetson)``.
- ``ok(spin=False)`` blocks until the next sample.
- ``power`` is ``{'rail': {name: {...}}, 'tot': {'online', 'type', 'status', 'volt' (mV),
  'curr' (mA), 'power' (mW), 'avg' (mW), 'name'}}``, or ``{}`` on a board without sensors.
- ``nvpmodel`` is an object whose ``repr``/``str`` is the mode's name (or None where absent);
  ``jetson_clocks`` is an object whose truth is whether jetson_clocks is on, with ``status``
  (or None where absent).
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

SERVICE_RUNNING = True
TRACE_MW = [7500]  # board total power, cycled one value per sample
SENSORS = True
NVPMODEL: str | None = "15W"
JETSON_CLOCKS: bool | None = False


class JtopException(Exception):
    """jtop.core.exceptions.JtopException."""


class NVPModel:
    def __init__(self, name: str, mode_id: int) -> None:
        self._nvpmodel_now = {"name": name, "id": mode_id}

    @property
    def id(self) -> int:
        return self._nvpmodel_now["id"]

    def __repr__(self) -> str:
        return self._nvpmodel_now["name"]


class JetsonClocks:
    def __init__(self, enable: bool) -> None:
        self._enable = enable

    @property
    def status(self) -> str:
        return "running" if self._enable else "inactive"

    def __bool__(self) -> bool:
        return self._enable

    def __repr__(self) -> str:
        return str(self._enable)


class jtop:  # noqa: N801 - the library's name
    def __init__(self, interval: float = 1.0) -> None:
        self._interval = float(interval)
        self._observers: set = set()
        self._running = False
        self._trigger = threading.Event()
        self._stats: dict = {"power": {}}
        self._n = 0
        self.samples_sent = 0

    def _sample(self) -> None:
        mw = TRACE_MW[self._n % len(TRACE_MW)]
        self._n += 1
        if SENSORS:
            rail = {"online": True, "type": "INA3221", "status": "ok", "volt": 5000, "curr": mw // 5, "power": mw, "avg": mw}
            self._stats = {"power": {"rail": {"VDD_CPU_GPU_CV": dict(rail, power=mw // 2, avg=mw // 2)}, "tot": dict(rail, name="VDD_IN")}}
        self.samples_sent += 1
        for observer in list(self._observers):
            observer(self)
        self._trigger.set()

    def _loop(self) -> None:
        while self._running:
            time.sleep(self._interval)
            if self._running:
                self._sample()

    def start(self) -> None:
        if not SERVICE_RUNNING:
            raise JtopException("The jtop.service is not active. Please run:\nsudo systemctl restart jtop.service")
        self._running = True
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._running = False

    def __enter__(self) -> "jtop":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ok(self, spin: bool = False) -> bool:
        if not spin:
            self._trigger.wait(self._interval * 4)
        self._trigger.clear()
        return self._running

    def attach(self, observer) -> None:
        self._observers.add(observer)

    def detach(self, observer) -> None:
        self._observers.discard(observer)

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def power(self) -> dict:
        return self._stats["power"]

    @property
    def nvpmodel(self) -> NVPModel | None:
        return None if NVPMODEL is None else NVPModel(NVPMODEL, 0)

    @property
    def jetson_clocks(self) -> JetsonClocks | None:
        return None if JETSON_CLOCKS is None else JetsonClocks(JETSON_CLOCKS)


def make_module():
    spec = importlib.util.spec_from_file_location("jtop", Path(__file__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
