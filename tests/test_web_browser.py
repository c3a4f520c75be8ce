"""End to end in a real headless browser: the daemon fed real photos, the page beside it.

The photos page shows what arrived, a key press on the review page puts a label into the queue the hand-off
delivers to the trainer, and a photo uploaded through the page gets its result. Each page is saved as a PNG
(``$EDGE_AGENT_SCREENSHOTS``, else the test's temporary folder) for a reviewer to look at; the README's
screenshots are these.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_helpers import DaemonProc, db_rows, wait_until

REPO = Path(__file__).resolve().parents[1]
GATE = REPO / "edge_agent" / "default_data" / "gate"
CHROMIUM, CHROMEDRIVER = (shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="Debian's chromium and chromium-driver are not installed (make install-dev installs them as root)",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the 'dev' extra)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,900",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def shots(tmp_path) -> Path:
    out = Path(os.environ.get("EDGE_AGENT_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _images_loaded(driver) -> bool:
    """Every picture in view has loaded (those below the fold load lazily, when scrolled to)."""
    return driver.execute_script(
        "return Array.from(document.images).filter(i => i.getBoundingClientRect().top < innerHeight)"
        ".every(i => i.complete && i.naturalWidth > 0)"
    )


def test_the_page_beside_a_running_daemon(tmp_path, browser, shots):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    photos = sorted(GATE.glob("*/*.jpg"))
    held_back = photos.pop(len(photos) // 2)  # uploaded through the page later
    daemon = DaemonProc(tmp_path / "state", {"labels": {"trust_checks": 10}}).start()  # the default: no class trusted yet
    web = None
    try:
        daemon.wait_ready()
        for p in photos:
            shutil.copy(p, daemon.inbox / p.name)
        wait_until(lambda: db_rows(daemon.state, "SELECT COUNT(*) FROM results")[0][0] == len(photos), 120, "every photo classified")
        port = _free_port()
        web = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edge_agent",
                "web",
                "--config",
                str(daemon.config_path),
                "--state-dir",
                str(daemon.state),
                "--port",
                str(port),
            ],
            cwd=REPO,
            stdout=open(tmp_path / "web.log", "w"),
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _listening(port), 30, "the web page listening")
        wait = WebDriverWait(browser, 30)

        # recent photos: what was dropped into the inbox, newest first
        def photos_page() -> bool:  # a 503 (the ledger locked past the page's wait) asks to be reloaded
            browser.get(base + "/photos")
            return "503 Service Unavailable" not in browser.find_element(By.TAG_NAME, "body").text

        wait_until(photos_page, 30, "the photos page")
        cards = browser.find_elements(By.CSS_SELECTOR, "#photos .card")
        shown = browser.find_element(By.TAG_NAME, "body").text[:600]
        assert len(cards) == 48 and f"({len(photos)})" in browser.find_element(By.TAG_NAME, "h1").text, (
            shown,
            (tmp_path / "web.log").read_text()[-2000:],
        )
        wait.until(_images_loaded)
        browser.save_screenshot(str(shots / "photos.png"))

        # the review queue: press "1" and the label reaches the queue the trainer is fed from
        browser.get(base + "/review")
        wait.until(_images_loaded)
        browser.save_screenshot(str(shots / "review.png"))
        browser.set_window_size(390, 844)  # a phone
        wait.until(_images_loaded)
        browser.save_screenshot(str(shots / "review-phone.png"))
        browser.set_window_size(1200, 900)
        review = browser.find_element(By.CSS_SELECTOR, ".review")
        photo_id = review.get_attribute("data-photo")
        first_class = browser.find_element(By.CSS_SELECTOR, 'button[data-key="1"]').get_attribute("value")
        ActionChains(browser).send_keys("1").perform()
        wait.until(lambda d: "done=" in d.current_url)
        assert photo_id in browser.find_element(By.ID, "done").text
        rows = db_rows(daemon.state, f"SELECT kind, label FROM label_queue WHERE photo_id = '{photo_id}'")
        sent = db_rows(daemon.state, "SELECT label FROM expert_labels")
        assert rows in ([("expert", first_class)], []) and sent == [(first_class,)]  # [] once already delivered and acknowledged

        # how far to trust each class: the expert's label read against the model's answer
        said = db_rows(daemon.state, f"SELECT label FROM results WHERE photo_id = '{photo_id}'")[0][0]
        browser.get(base + "/trust")
        row = browser.find_element(By.CSS_SELECTOR, f'#trust tr[data-class="{said}"]')
        assert "not yet" in row.text  # one check is not enough to earn pseudo-labels
        assert "98 % sure or surer" in browser.find_element(By.TAG_NAME, "body").text  # what trust covers ([labels] trust_confidence)
        assert browser.find_element(By.ID, "audit-share").text == "5 %"  # a trusted class's audits ([labels] audit_share)
        cells = browser.find_elements(By.CSS_SELECTOR, f'#confusion tr[data-class="{said}"] td')
        assert "1" in [c.text for c in cells[1:]]
        browser.save_screenshot(str(shots / "trust.png"))

        # upload a photo the daemon has not seen; follow the link until its result is there
        browser.get(base + "/upload")
        browser.find_element(By.ID, "upload-input").send_keys(str(held_back))
        browser.find_element(By.CSS_SELECTOR, "#upload-form button").click()
        wait.until(lambda d: d.find_elements(By.ID, "outcomes"))
        browser.save_screenshot(str(shots / "upload.png"))
        browser.find_element(By.LINK_TEXT, "see its result").click()
        WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.ID, "result"))
        wait.until(_images_loaded)
        browser.save_screenshot(str(shots / "photo.png"))
        assert db_rows(daemon.state, "SELECT COUNT(*) FROM results")[0][0] == len(photos) + 1

        # photos unlike the lab ones: a blank frame (always "not a plant I know") and, where the field photos are
        # beside the repository, a few of them; the page must say so instead of naming a disease
        import cv2
        import numpy as np

        cv2.imwrite(str(daemon.inbox / "blank-frame.jpg"), np.full((300, 300, 3), 128, np.uint8))
        field = sorted((REPO.parent / "shared" / "data" / "field").glob("*/*/*.jpg"))[::97][:11]
        for p in field:
            shutil.copy(p, daemon.inbox / f"field-{p.name}")
        total = len(photos) + 2 + len(field)
        wait_until(lambda: db_rows(daemon.state, "SELECT COUNT(*) FROM results")[0][0] == total, 60, "the field photos classified")
        browser.get(base + "/photos")
        wait.until(_images_loaded)
        marks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#photos .verdict")]
        assert "Not a plant I know" in marks
        browser.save_screenshot(str(shots / "verdicts.png"))
        blank = db_rows(daemon.state, "SELECT sha256 FROM results WHERE path LIKE '%blank-frame.jpg'")[0][0]
        browser.get(f"{base}/photo/{blank}")  # its page says why, not only that it is no plant the model knows
        wait.until(_images_loaded)
        assert browser.find_element(By.ID, "verdict-reason").text == "(the photo is nearly one colour)"
        browser.save_screenshot(str(shots / "photo-unknown.png"))

        # several photos of one plant (an inbox subfolder): one diagnosis on the Plants page
        tree = daemon.inbox / "tree 1"
        tree.mkdir()
        same_class = sorted(GATE.glob("*/*.jpg"))[:3]  # one class's photos, re-encoded: photos the daemon has not seen
        for i, p in enumerate(same_class):
            cv2.imwrite(str(tree / f"leaf-{i}.jpg"), cv2.imread(str(p)), [cv2.IMWRITE_JPEG_QUALITY, 85])
        wait_until(
            lambda: db_rows(daemon.state, "SELECT COUNT(*) FROM results WHERE plant = 'tree 1'")[0][0] == 3, 60, "the plant's photos"
        )
        # and a plant whose photo the expert labelled: the expert's label is its diagnosis
        tree2 = daemon.inbox / "tree 2"
        tree2.mkdir()
        for i, p in enumerate(sorted(GATE.glob("*/*.jpg"))[-2:]):
            img = cv2.imread(str(p))
            cv2.imwrite(str(tree2 / f"leaf-{i}.jpg"), cv2.GaussianBlur(img, (0, 0), 6) // 2 + 40)  # blurred and dim: unsure
        wait_until(
            lambda: db_rows(daemon.state, "SELECT COUNT(*) FROM results WHERE plant = 'tree 2'")[0][0] == 2, 60, "the second plant's photos"
        )
        queued = db_rows(
            daemon.state,
            "SELECT q.photo_id FROM label_queue q JOIN results r ON r.sha256 = q.sha256 WHERE r.plant = 'tree 2' AND q.kind = 'review'",
        )
        assert queued, "neither blurred photo went to the review pool"
        subprocess.run(
            [sys.executable, "-m", "edge_agent", "review", "label", "--state-dir", str(daemon.state), queued[0][0], "Apple___Black_rot"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        browser.get(base + "/plants")
        wait.until(_images_loaded)
        plant = browser.find_element(By.CSS_SELECTOR, 'section.plant[data-plant="tree 1"]')
        assert "3 photos" in plant.text and len(plant.find_elements(By.CSS_SELECTOR, ".card")) == 3
        labelled = browser.find_element(By.CSS_SELECTOR, 'section.plant[data-plant="tree 2"]').text
        assert "labelled by the expert" in labelled and "expert: Apple · Black rot" in labelled
        browser.save_screenshot(str(shots / "plants.png"))
        browser.find_element(By.CSS_SELECTOR, 'section.plant[data-plant="tree 2"] h2 a').click()  # the plant's own page
        wait.until(lambda b: b.current_url.endswith("/plants/tree%202"))
        wait.until(_images_loaded)
        assert (
            browser.find_element(By.TAG_NAME, "h1").text.startswith("tree 2") and len(browser.find_elements(By.CSS_SELECTOR, ".card")) == 2
        )
        ticks = {c.get_attribute("value"): c.is_selected() for c in browser.find_elements(By.CSS_SELECTOR, '.card input[name="photo"]')}
        assert sorted(ticks.values()) == [False, True]  # the photo the expert labelled is not ticked; the other is
        browser.find_element(By.CSS_SELECTOR, '#plant-label input[name="label"]').send_keys("Apple___Black_rot")
        browser.save_screenshot(str(shots / "plant.png"))
        browser.find_element(By.CSS_SELECTOR, "#plant-label button").click()  # the ticked photo labelled as the other was
        said = wait.until(lambda b: b.find_elements(By.ID, "plant-labelled"))[0].text
        assert said.startswith("Labelled 1 photo Apple · Black rot")
        assert [c.text.count("expert: Apple · Black rot") for c in browser.find_elements(By.CSS_SELECTOR, ".card")] == [1, 1]
        browser.find_element(By.CSS_SELECTOR, ".card a").click()  # one of its photos links back to it
        assert browser.find_element(By.ID, "plant-link").text == "tree 2"
        about = browser.find_element(By.ID, "about")  # what to look for on the tree to confirm the expert's class
        assert about.text.startswith("About Black rot (the expert's label)") and "Frog-eye" in browser.find_element(By.ID, "look-for").text
        about.find_element(By.ID, "about-link").click()  # the class's own page: its cause, how it spreads, its photos
        wait.until(lambda b: b.current_url.endswith("/classes/Apple___Black_rot"))
        assert browser.find_element(By.TAG_NAME, "h1").text == "Black rot (Apple)" and browser.find_element(By.ID, "spread").text
        browser.find_element(By.CSS_SELECTOR, "#farm-notes summary").click()  # this farm's own words, on the page
        browser.find_element(By.CSS_SELECTOR, '#notes-form textarea[name="act"]').send_keys("Mumien beim Schnitt entfernen.")
        browser.find_element(By.CSS_SELECTOR, "#notes-form button").click()
        wait.until(lambda b: b.find_elements(By.ID, "notes-saved"))
        assert browser.find_element(By.ID, "act").text == "Mumien beim Schnitt entfernen."
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(str(shots / "class.png"))
        browser.find_element(By.LINK_TEXT, "Every class the model knows").click()
        wait.until(lambda b: b.current_url.endswith("/classes"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "section.crop")) == 14
        browser.save_screenshot(str(shots / "classes.png"))

        # photos from a phone with its GPS on: drawn where they were taken, each dot a link to its photo
        from PIL import Image, TiffImagePlugin

        def dms(x: float) -> tuple:
            r, d = TiffImagePlugin.IFDRational, int(x)
            return (r(d, 1), r(int((x - d) * 60), 1), r(round(((x - d) * 60 - int((x - d) * 60)) * 6000), 100))

        for i, p in enumerate(sorted(GATE.glob("*/*.jpg"))[3:6]):
            exif = Image.Exif()
            gps = exif.get_ifd(0x8825)
            gps[1], gps[2], gps[3], gps[4] = "N", dms(47.3978 + i * 0.00005), "E", dms(8.5472 + i * 0.00004)
            Image.open(p).save(daemon.inbox / f"gps-{i}.jpg", "JPEG", exif=exif.tobytes(), quality=90)
        wait_until(lambda: db_rows(daemon.state, "SELECT COUNT(*) FROM results WHERE lat IS NOT NULL")[0][0] == 3, 60, "the GPS photos")
        browser.get(base + "/map")
        dots = browser.find_elements(By.CSS_SELECTOR, "#field-map circle.dot")
        assert len(dots) == 3 and browser.find_element(By.ID, "map-scale").text.endswith("m")
        assert "have no position" in browser.find_element(By.ID, "map-without").text
        size = browser.get_window_size()
        browser.set_window_size(1200, 1000)  # the whole map in the shot
        browser.save_screenshot(str(shots / "map.png"))
        browser.set_window_size(size["width"], size["height"])
        ActionChains(browser).move_to_element(dots[0]).click().perform()  # a dot opens its photo
        wait.until(lambda b: "/photo/" in b.current_url)
        place = browser.find_element(By.ID, "place").text
        assert place.startswith("47.39") and "2 other photos taken within 15 m" in place, place
        spot = browser.find_element(By.ID, "spot-label")  # the three leaves of one tree, labelled together
        assert len(spot.find_elements(By.CSS_SELECTOR, 'input[name="photo"]:checked')) == 3
        spot.find_element(By.CSS_SELECTOR, 'input[name="label"]').send_keys("Apple___Apple_scab")
        browser.execute_script("arguments[0].scrollIntoView()", spot)
        browser.save_screenshot(str(shots / "spot.png"))
        spot.find_element(By.CSS_SELECTOR, "button").click()
        said = wait.until(lambda b: b.find_elements(By.ID, "spot-labelled"))[0].text
        assert said.startswith("Labelled 3 photos"), said
        assert db_rows(daemon.state, "SELECT COUNT(*) FROM expert_labels WHERE label = 'Apple___Apple_scab'")[0][0] >= 3

        for page in ("engines", "health"):
            browser.get(f"{base}/{page}")
            assert browser.find_elements(By.CSS_SELECTOR, "#engines, #daemon")
            browser.save_screenshot(str(shots / f"{page}.png"))
        assert "running" in browser.find_element(By.ID, "daemon").text
    finally:
        if web is not None:
            web.terminate()
            assert web.wait(15) == 0
        assert daemon.terminate() == 0


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def test_the_fleet_page_on_a_trainers_machine(tmp_path, browser, shots):
    """The Fleet page renders what a trainer's status holds (rows made by the engine server's and the rollout's own
    code; the farm test drives the real thing): a stopped rollout and why, a pin, a refusal, a refused connection."""
    import json
    import time

    from selenium.webdriver.common.by import By

    from edge_agent.state import write_status
    from edge_agent.trainer_config import RolloutSection
    from trainer.rollout import Rollout
    from trainer.transfer import Peer

    state = tmp_path / "state"
    (state / "trainer").mkdir(parents=True)
    now = time.time()
    peers = [
        Peer("greenhouse", address="192.168.1.21", last_seen=now - 2, engine_version="v1001", queue=0, report={"photos": 212}),
        Peer(
            "shed",
            address="192.168.1.22",
            last_seen=now - 1,
            engine_version="v1000",
            queue=14,
            pinned="v1000",
            refused={
                "v1001": "pinned to v1000 by a rollback from v1001: only a newer version moves it (edge-agent engine unpin lifts the pin)"
            },
        ),
        Peer("stolen", address="192.168.1.66", last_seen=now - 30, engine_version="v1000", queue=0, revoked=True),
        Peer(
            "barn",
            address="192.168.1.40",
            last_seen=now - 3,
            engine_version="v1000",
            queue=3,
            refused={
                "v1001": "v1001: signed by key 3f1c2a9b..., which this device does not trust (add it to [store] trusted_keys); refusing to serve it"
            },
        ),
    ]
    rollout = Rollout(RolloutSection(), state / "trainer" / "rollout.json")
    rollout._start("v1001")
    rollout.state["canaries"] = ["greenhouse", "shed"]
    rollout._stop("canary shed: " + "refused v1001: " + peers[1].refused["v1001"])
    write_status(
        state / "trainer" / "status.json",
        {
            "pid": os.getpid(),
            "updated": now,
            "state": "idle",
            "samples": {"new": 12},
            "retrain_threshold": 200,
            "next_publish": _a_days_labels_plan(),
            "fleet": [p.describe(s) for p, s in zip(peers, (340, 95, 0, 12))],
            "rollout": rollout.describe(),
            "handshakes_refused": [{"address": "192.168.1.77", "count": 41, "last": now - 5, "reason": "Unknown key"}],
        },
    )
    port = _free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "web", "--state-dir", str(state), "--port", str(port)],
        cwd=REPO,
        stdout=open(tmp_path / "web.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: _listening(port), 30, "the web page listening")
        browser.get(f"http://127.0.0.1:{port}/fleet")
        rows = {r.get_attribute("data-device"): r.text for r in browser.find_elements(By.CSS_SELECTOR, "#fleet tr[data-device]")}
        assert set(rows) == {"greenhouse", "shed", "stolen", "barn"}
        assert "revoked" in rows["stolen"] and "revoked" not in rows["barn"]
        assert "pinned to v1000" in rows["shed"] and "does not trust" in rows["barn"] and "canary" in rows["greenhouse"]
        assert "Rollout of v1001 stopped" in browser.find_element(By.ID, "rollout").text
        assert "192.168.1.77" in browser.find_element(By.ID, "handshakes").text
        browser.save_screenshot(str(shots / "fleet.png"))
        assert json.loads((state / "trainer" / "rollout.json").read_text())["stage"] == "stopped"
        browser.get(f"http://127.0.0.1:{port}/health")  # what the next version waits for, in words
        said = browser.find_element(By.ID, "next-publish").text
        assert said.startswith("Next version: 14 more expert labels") and "Cedar apple rust (Apple)" in said and "Review" in said
        browser.save_screenshot(str(shots / "health-next-publish.png"))
    finally:
        web.terminate()
        assert web.wait(15) == 0


def _a_days_labels_plan() -> dict:
    """What the trainer says after a day's ten expert labels (4 scab, 3 rust, 3 healthy), as it computes it."""
    from edge_agent.trainer_config import TrainerSection
    from trainer.loop.next_publish import plan
    from trainer.samples import Sample

    labels = ["Apple___Apple_scab"] * 4 + ["Apple___Cedar_apple_rust"] * 3 + ["Apple___healthy"] * 3
    samples = [Sample(f"{i:064x}", "expert", c, 1.0, "v2000", "", 1000.0 + i, None) for i, c in enumerate(labels)]
    return plan(samples, {"pseudo": 0, "expert": 10, "new": 10, "new_expert": 10}, TrainerSection()).as_dict()
