"""Board temperature and power: the kernel's thermal zones, jtop's power (fake), and boards with neither."""

from __future__ import annotations

import sys
import time

import pytest

from edge_agent.board import BoardSensors, thermal_zones
from edge_agent.latency import BUCKETS_MS, LatencyHistograms

from .fakes import jtop as fake_jtop


def zone(root, n: int, kind: str, temp: str) -> None:
    d = root / f"thermal_zone{n}"
    d.mkdir(parents=True)
    (d / "type").write_text(kind + "\n")
    (d / "temp").write_text(temp + "\n")


def test_thermal_zones_are_read_in_degrees_and_unreadable_or_absurd_ones_left_out(tmp_path):
    zone(tmp_path, 0, "cpu-thermal", "51234")
    zone(tmp_path, 1, "gpu-thermal", "48000")
    zone(tmp_path, 2, "cpu-thermal", "50000")  # a second zone of the same type keeps its own name
    zone(tmp_path, 3, "asleep", "")  # a sensor that answers nothing
    zone(tmp_path, 4, "tj-thermal", "-274000")  # a driver's "not available"
    (tmp_path / "thermal_zone5").mkdir()  # no files at all
    assert thermal_zones(tmp_path) == {"cpu-thermal": 51.2, "gpu-thermal": 48.0, "cpu-thermal-2": 50.0}


def test_a_machine_without_thermal_zones_reports_none_and_says_why_there_is_no_power(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jtop", None)  # jetson-stats not installed
    reading = BoardSensors(tmp_path / "none").read()
    assert reading["temperature_c"] == {} and reading["power_w"] is None and "jtop" in reading["power_why"]


@pytest.fixture
def jtop_module(monkeypatch):
    module = fake_jtop.make_module()
    monkeypatch.setitem(sys.modules, "jtop", module)
    return module


def test_on_a_jetson_the_board_power_comes_from_jtops_total_rail(tmp_path, jtop_module):
    jtop_module.TRACE_MW = [7250]
    sensors = BoardSensors(tmp_path)
    try:
        reading = sensors.read()
        assert reading["power_w"] == 7.25 and reading["power_source"] == "jtop VDD_IN"
    finally:
        sensors.close()


def test_a_stopped_jtop_service_gives_no_power_with_its_reason_and_is_not_asked_every_round(tmp_path, jtop_module):
    jtop_module.SERVICE_RUNNING = False
    sensors = BoardSensors(tmp_path)
    first = sensors.read()
    assert first["power_w"] is None and "did not start" in first["power_why"] and "jtop.service" in first["power_why"]
    jtop_module.SERVICE_RUNNING = True
    assert sensors.read()["power_w"] is None  # retried after minutes, not on each status write
    sensors._tried = time.monotonic() - 3600
    try:
        assert sensors.read()["power_w"] == 7.5
    finally:
        sensors.close()


def test_a_jetson_without_power_sensors_reports_no_power(tmp_path, jtop_module):
    jtop_module.SENSORS = False
    sensors = BoardSensors(tmp_path)
    try:
        assert sensors.read()["power_w"] is None
    finally:
        sensors.close()


def test_latency_histograms_count_each_stage_into_its_bucket_and_above_the_last():
    h = LatencyHistograms()
    h.observe({"total": 5.0, "infer": 3.0, "batch": 4})
    h.observe({"total": 99999.0})
    h.observe({"total": "garbage", "infer": -1})
    d = h.as_dict()
    assert d["total"]["count"] == 2 and d["total"]["counts"][0] == 1 and d["total"]["counts"][-1] == 1
    assert d["total"]["sum"] == 100004.0 and d["infer"]["count"] == 1 and d["preprocess"]["count"] == 0
    assert len(d["total"]["counts"]) == len(BUCKETS_MS) + 1
