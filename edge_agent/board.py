"""The board's temperatures and power where it gives them: the kernel's thermal zones, and jtop on a Jetson.

Nothing is estimated: a board without a sensor reports none, with the reason. jtop (jetson-stats) is imported only
when present, started once, and read through an observer its own thread calls, so a status round never waits on it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

__all__ = ["THERMAL", "thermal_zones", "BoardSensors", "as_reported"]

THERMAL = Path("/sys/class/thermal")
_JTOP_RETRY_S = 300.0


def thermal_zones(root: Path = THERMAL) -> dict[str, float]:
    """{zone type: degrees C} from ``root/thermal_zone*/{type,temp}`` (millidegrees); unreadable zones are left out."""
    out: dict[str, float] = {}
    for zone in sorted(root.glob("thermal_zone*")):
        try:
            name = (zone / "type").read_text().strip() or zone.name
            milli = int((zone / "temp").read_text().strip())
        except (OSError, ValueError):  # a zone whose sensor is asleep answers EIO or EAGAIN
            continue
        if not -60_000 <= milli <= 200_000:  # a driver's "not available" value
            continue
        key, n = name, 2
        while key in out:
            key, n = f"{name}-{n}", n + 1
        out[key] = round(milli / 1000.0, 1)
    return out


class BoardSensors:
    """Reads the thermal zones each time; keeps jtop's latest board power when jtop runs here."""

    def __init__(self, thermal_root: Path = THERMAL, jtop: bool = True) -> None:
        self.thermal_root = thermal_root
        self.use_jtop = jtop
        self._jetson = None
        self._power: tuple[float, str] | None = None
        self._why = "no power sensor read here (jtop of jetson-stats reads a Jetson's)"
        self._tried = -_JTOP_RETRY_S
        self._lock = threading.Lock()

    def read(self) -> dict:
        """``{"temperature_c": {zone: C}, "power_w": W or None, "power_source" or "power_why": ...}``."""
        self._start_jtop()
        with self._lock:
            power = self._power
        out: dict = {"temperature_c": thermal_zones(self.thermal_root)}
        if power is not None:
            out["power_w"], out["power_source"] = power
        else:
            out["power_w"], out["power_why"] = None, self._why
        return out

    def _observe(self, jetson) -> None:
        total = (jetson.power or {}).get("tot") or {}
        if "power" in total:
            with self._lock:
                self._power = (round(float(total["power"]) / 1000.0, 3), f"jtop {total.get('name', 'total')}")

    def _start_jtop(self) -> None:
        if not self.use_jtop or self._jetson is not None or time.monotonic() - self._tried < _JTOP_RETRY_S:
            return
        self._tried = time.monotonic()
        try:
            from jtop import jtop  # jetson-stats; talks to the jtop service over /run/jtop.sock
        except ImportError:
            self.use_jtop = False  # not a Jetson (or jetson-stats not installed): never asked again
            return
        try:
            jetson = jtop(interval=1.0)
            jetson.start()
        except Exception as exc:  # noqa: BLE001 - JtopException (service not running), a socket error
            self._why = f"jtop is installed but did not start: {exc}"
            return
        jetson.attach(self._observe)
        self._observe(jetson)  # the sample it has now; later ones arrive through the observer
        self._jetson = jetson

    def close(self) -> None:
        if self._jetson is not None:
            try:
                self._jetson.close()
            except Exception:  # noqa: BLE001 - closing at exit: nothing left to do about it
                pass
            self._jetson = None


def as_reported(daemon_status: dict, running: bool) -> dict:
    """The board as the running daemon last reported it (power included), else the thermal zones read now."""
    board = daemon_status.get("board")
    return board if running and isinstance(board, dict) else {"temperature_c": thermal_zones()}
