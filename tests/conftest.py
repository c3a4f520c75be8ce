"""Shared fixtures: real photos from ../shared, synthetic images, and a tiny published store."""

from __future__ import annotations

import os
import sqlite3
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) the tests marked ``both_cores`` run first, one at a time on one worker.

    Two of them side by side on two cores each ran 2-3.6x slower and broke their time bounds; the other tests, which mostly
    wait on daemons, sockets and timers, run beside them, a module at a time so that a module's fixtures are made once.
    A test marked ``one_core`` in a module marked ``both_cores`` (it starts a process or reads a store, and trains
    nothing) runs with the others.
    """
    heavy = {item for item in items if item.get_closest_marker("both_cores") and not item.get_closest_marker("one_core")}
    for item in items:
        item.add_marker(pytest.mark.xdist_group("both_cores" if item in heavy else item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item not in heavy)  # stable: the heavy first, each part in collection order


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test():
    """A test that fails before stopping its daemon or trainer leaves no process behind (seen: a daemon a failed test
    left running quarantined a photo of the next run's test of the same name, which reuses its folder)."""
    yield
    from .daemon_helpers import kill_leftovers

    kill_leftovers()


@pytest.fixture(scope="session")
def _logging_at_start():
    """The logging configuration the session started with."""
    import structlog

    from edge_agent import log

    return structlog.get_config(), dict(log._settings)


@pytest.fixture(autouse=True)
def _logging_as_the_session_started(_logging_at_start):
    """A test (or a module's fixture: test_recipe_sweep_benchmark.py runs the sweep once, which logs at warning) that
    configures logging leaves it so for what follows on its worker: a logger made under a level above info drops the
    info lines ``capture_logs`` waits for (the trust journal's test got its warning line and not its info line). After
    every test the configuration the session started with is put back."""
    import structlog

    from edge_agent import log

    yield
    before, settings = _logging_at_start
    structlog.configure(**before)
    log._settings.update(settings)


@pytest.fixture(autouse=True)
def _a_cpu_with_vnni(monkeypatch):
    """In-process tests run as on a CPU with VNNI (or not x86), wherever the suite runs: which precision ``auto`` picks
    must not depend on the CI machine's CPU. tests/test_int8_here.py gives a CPU without VNNI where it tests one."""
    from engines.backends import _ort_precision

    monkeypatch.setattr(_ort_precision, "x86_without_vnni", lambda cpuinfo="/proc/cpuinfo": False)


def pytest_configure(config):
    """Refuse ``--dist loadgroup`` under pytest 9.2, where pytest-xdist silently drops the groups and two trainers would run side by side."""
    if config.getoption("dist", "no") == "loadgroup" and tuple(int(p) for p in pytest.__version__.split(".")[:2]) >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} breaks pytest-xdist's --dist loadgroup (pytest-dev/pytest-xdist#1386): "
            "install the dev extra's pytest (pip install -e '.[dev]'), or run without -n"
        )


def plantvillage_dir() -> Path | None:
    env = os.environ.get("EDGE_AGENT_PLANTVILLAGE")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared/data/plantvillage", REPO / "shared/data/plantvillage"]:
        if cand.is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def plantvillage() -> Path:
    d = plantvillage_dir()
    if d is None:
        pytest.skip("real PlantVillage photos not found (expected ../shared/data/plantvillage or $EDGE_AGENT_PLANTVILLAGE)")
    return d


@pytest.fixture(scope="session")
def real_photo(plantvillage: Path) -> Path:
    return sorted((plantvillage / "Apple___Apple_scab").glob("*.jpg"))[0]


def leaf_image(seed: int, size: tuple[int, int] = (160, 200), hue: int | None = None) -> np.ndarray:
    """A synthetic BGR 'leaf': an ellipse of a class-specific hue with random spots, on a grey background."""
    rng = np.random.default_rng(seed)
    h, w = size
    img = np.full((h, w, 3), 200, np.uint8)
    hue = int(rng.integers(0, 180)) if hue is None else hue
    color = cv2.cvtColor(np.uint8([[[hue, 200, 180]]]), cv2.COLOR_HSV2BGR)[0, 0].tolist()
    cv2.ellipse(img, (w // 2, h // 2), (w // 3, h // 3), float(rng.integers(0, 180)), 0, 360, color, -1)
    for _ in range(8):
        c = (int(rng.integers(w // 4, 3 * w // 4)), int(rng.integers(h // 4, 3 * h // 4)))
        cv2.circle(img, c, int(rng.integers(2, 8)), (40, 40, 90), -1)
    return img


def encode(img: np.ndarray, ext: str = ".jpg") -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


def with_exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """Insert an EXIF APP1 segment carrying ``orientation`` right after SOI."""
    tiff = b"MM\x00\x2a\x00\x00\x00\x08" + struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + b"\x00" * 4
    app1 = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + jpeg[2:]


def make_class_folders(root: Path, names: list[str], per_class: int, size=(140, 150)) -> Path:
    for i, name in enumerate(names):
        d = root / name
        d.mkdir(parents=True)
        for j in range(per_class):
            (d / f"img_{j:03d}.jpg").write_bytes(encode(leaf_image(1000 * i + j, size, hue=(i * 60) % 180)))
    return root


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory):
    """The key the test stores are signed with (daemons trust it through ``trusted_store``)."""
    from engines.signing import load_or_create_key

    return load_or_create_key(tmp_path_factory.mktemp("keys") / "test-signing.key")


def trusted_store(path, key) -> dict:
    """The ``[store]`` section of a daemon serving ``path``, whose versions ``key`` signed."""
    return {"path": str(path), "trusted_keys": [key.public_hex]}


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory, signing_key) -> Path:
    """A store with one version of an untrained 3-class model (ONNX, INT8, weights), signed with ``signing_key``."""
    torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is needed to build a model")
    from edge_agent.preprocess import preprocess_bytes
    from trainer.models import build_model
    from trainer.publish import publish_model

    torch.manual_seed(0)
    model = build_model(3).eval()
    calib = np.stack([preprocess_bytes(encode(leaf_image(i))) for i in range(8)])
    root = tmp_path_factory.mktemp("tiny-store")
    publish_model(
        model,
        ["Tomato___healthy", "Pepper,_bell___healthy", "Orange___Haunglongbing_(Citrus_greening)"],
        root,
        calibration=calib,
        held_out=(calib, np.array([0, 1, 2, 0, 1, 2, 0, 1])),
        training={"kind": "test-fixture"},
        signing_key=signing_key,
    )
    return root


def sqlite_full_error() -> sqlite3.OperationalError:
    """A genuine SQLITE_FULL error ("database or disk is full", the code a full disk gives): a database capped at two
    pages, filled."""
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (x)")
    con.execute("PRAGMA max_page_count = 2")
    try:
        for _ in range(100):
            con.execute("INSERT INTO t VALUES (?)", ("x" * 1000,))
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        con.close()
    raise AssertionError("the capped database took every row")


def rot_pages(db: Path, table: str, kind: str | None = None, only: int | None = None) -> None:
    """Overwrite the head of every page of ``table`` (an index's name names the index) in place, as a card that rots
    them does (size and times kept); ``kind`` ("leaf", "internal") and ``only`` (that one of them) narrow which."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        pages = [n for (n, t) in con.execute("SELECT pageno, pagetype FROM dbstat WHERE name = ?", (table,)) if kind in (None, t)]
        size = con.execute("PRAGMA page_size").fetchone()[0]
    assert pages, f"no {kind or ''} page of {table} in {db}"
    pages = pages if only is None else [pages[only]]
    st = db.stat()
    with open(db, "r+b") as f:
        for n in pages:
            f.seek((n - 1) * size)
            f.write(b"\xff" * 64)
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def card(tmp_path):
    """A disk of the test's own that it can shut down as a card dies or loses its power (tests/card_helpers.py)."""
    import subprocess

    from .card_helpers import make_card

    made = make_card(tmp_path)
    try:
        yield made
    finally:
        subprocess.run(["umount", "-l", str(made.path)], capture_output=True)
