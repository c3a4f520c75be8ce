"""What the backup tests share: a configuration naming a stick, and a season's state directory to back up."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge_agent.config import AppConfig, override

from .web_helpers import make_state

__all__ = ["stick_cfg", "stick_fixtures"]


def stick_cfg(folder: Path, **backup) -> AppConfig:
    """The default configuration with ``[backup] dir = folder`` and the other ``[backup]`` keys given."""
    return override(AppConfig(), {"backup.dir": str(folder), **{f"backup.{k}": v for k, v in backup.items()}})


def stick_fixtures():
    """The fixtures ``stick`` (autouse: the test's folders, on the state directory's disk, taken as a stick of their
    own), ``season`` (a state directory made once a module) and ``state`` (a copy of it for one test to change)."""

    @pytest.fixture(autouse=True)
    def stick(monkeypatch):
        monkeypatch.setattr("edge_agent.backup_folder._same_disk", lambda a, b: False)

    @pytest.fixture(scope="module")
    def season(tmp_path_factory) -> Path:
        return make_state(tmp_path_factory.mktemp("season"))

    @pytest.fixture()
    def state(tmp_path, season) -> Path:
        out = tmp_path / "state"
        shutil.copytree(season, out)
        return out

    return stick, season, state
