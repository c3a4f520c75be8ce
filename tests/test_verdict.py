"""The verdict with every answer: confident, unsure or unknown, and what each does to the label queue."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge_agent.preprocess import DEFAULT_SPEC, normalize
from edge_agent.verdict import Judge, VerdictSpec, VerdictSpecError, image_checks, phrase

from .conftest import encode, leaf_image

K = 3
CLASSES = ["a", "b", "c"]


def section(**over) -> dict:
    """A verdict section whose class means sit at 3 on their own axis, with identity precision."""
    s = {
        "means": (np.eye(K) * 3).tolist(),
        "precision": np.eye(K).tolist(),
        "confident_distance": 4.0,
        "unknown_distance": 25.0,
        "image": {"min_contrast": 0.02, "min_brightness": 0.06, "max_brightness": 0.97, "min_sharpness": 0.0},
    }
    s.update(over)
    return s


def photo_batch(n: int) -> np.ndarray:
    return np.stack([normalize(np.ascontiguousarray(leaf_image(i, (128, 128))[:, :, ::-1])) for i in range(n)])


def probs_of(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def judge(**over) -> Judge:
    return Judge(VerdictSpec.from_manifest({"classes": CLASSES, "verdict": section(**over)}), 0.9, DEFAULT_SPEC.mean, DEFAULT_SPEC.std)


def test_near_a_class_mean_and_sure_is_confident_far_from_every_class_is_unknown_between_is_unsure():
    j = judge()
    logits = np.array([[3.5, 0.2, 0.0], [12.0, 0.0, 0.0], [3.0, 0.0, 8.0], [3.0, 2.9, 0.0]])
    got = [v.verdict for v in j.judge(logits, probs_of(logits), photo_batch(4))]
    # 1: at its mean, softmax 0.94; 2: softmax 1.00 but 9 from the mean (81 > 25); 3: 34 from c's mean; 4: softmax 0.5.
    assert got == ["confident", "unknown", "unknown", "unsure"]
    assert j.distances(logits)[0] == pytest.approx(0.29)


def test_a_sure_softmax_further_than_the_confident_distance_is_unsure_not_confident():
    logits = np.array([[5.5, 0.0, 0.0]])  # softmax 0.99, 6.25 from class a's mean: beyond 4, within 25
    (v,) = judge().judge(logits, probs_of(logits), photo_batch(1))
    assert v.verdict == "unsure" and "further" in v.reason and v.distance == pytest.approx(6.25)


def test_a_photo_all_one_colour_or_dark_or_blurred_is_unknown_whatever_the_model_says():
    logits = np.array([[3.0, 0.0, 0.0]] * 3)
    flat = normalize(np.full((128, 128, 3), 120, np.uint8))
    dark = normalize(np.random.default_rng(0).integers(0, 26, (128, 128, 1)).repeat(3, 2).astype(np.uint8))  # a night frame: noise
    blurred = normalize(np.ascontiguousarray(__import__("cv2").GaussianBlur(leaf_image(2, (128, 128)), (0, 0), 8)[:, :, ::-1]))
    j = judge(image={"min_contrast": 0.02, "min_brightness": 0.06, "max_brightness": 0.97, "min_sharpness": 1e-4})
    got = j.judge(logits, probs_of(logits), np.stack([flat, dark, blurred]))
    assert [v.verdict for v in got] == ["unknown"] * 3
    assert [v.reason for v in got] == ["the photo is nearly one colour", "the photo is too dark", "the photo is blurred"]


def test_a_manifest_without_verdict_statistics_falls_back_to_the_softmax_and_says_so():
    j = Judge(VerdictSpec.from_manifest({"classes": CLASSES}), 0.9, DEFAULT_SPEC.mean, DEFAULT_SPEC.std)
    logits = np.array([[40.0, 0.0, 0.0], [1.0, 0.9, 0.0]])
    assert [v.verdict for v in j.judge(logits, probs_of(logits), photo_batch(2))] == ["confident", "unsure"]
    assert "softmax >= 0.9 only" in j.mode


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"means": np.eye(2).tolist()}, "must be \\(3, 3\\)"),
        ({"precision": [[float("nan")] * 3] * 3}, "finite"),
        ({"confident_distance": 30.0}, "confident_distance <= unknown_distance"),
        ({"image": {}}, "min_contrast"),
    ],
)
def test_a_malformed_verdict_section_is_refused_with_what_is_wrong(bad, message):
    with pytest.raises(VerdictSpecError, match=message):
        VerdictSpec.from_manifest({"classes": CLASSES, "verdict": section(**bad)})


def test_image_checks_measure_contrast_brightness_and_sharpness():
    contrast, brightness, sharpness = image_checks(photo_batch(2), DEFAULT_SPEC.mean, DEFAULT_SPEC.std)
    assert (contrast > 0.05).all() and ((brightness > 0.2) & (brightness < 0.9)).all() and (sharpness > 1e-4).all()


def test_image_checks_of_many_photos_take_memory_for_one_chunk_and_give_the_same_figures():
    import tracemalloc

    batch = np.repeat(photo_batch(4), 32, axis=0)  # 128 photos, 25 MB
    whole = image_checks(batch, DEFAULT_SPEC.mean, DEFAULT_SPEC.std, chunk=len(batch))
    tracemalloc.start()
    try:
        chunked = image_checks(batch, DEFAULT_SPEC.mean, DEFAULT_SPEC.std, chunk=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert all(np.array_equal(a, b) for a, b in zip(whole, chunked))
    assert peak < batch.nbytes / 4  # in one piece its temporaries were several times the batch (0.59 GB for a gate)


def test_the_farmer_reads_the_class_only_when_confident():
    assert phrase("confident", "Apple___healthy") == "Apple___healthy"
    assert phrase("unsure", "Apple___healthy") == "not sure: ask an expert (best guess Apple___healthy)"
    assert phrase("unknown", "Apple___healthy").startswith("not a plant I know")
    assert phrase(None, "Apple___healthy") == "Apple___healthy"  # results from before verdicts


# ---- fitting, INT8 and the engine ------------------------------------------------------------------


def test_fit_verdict_takes_thresholds_from_the_held_out_photos_and_refuses_too_few():
    from trainer.verdict_fit import fit_verdict

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(K), 50)
    train = np.eye(K)[y] * 8 + rng.normal(0, 1, (len(y), K))
    held = np.eye(K)[np.repeat(np.arange(K), 20)] * 8 + rng.normal(0, 1.3, (60, K))
    s = fit_verdict(train, y, held, photo_batch(60), DEFAULT_SPEC)
    spec = VerdictSpec.from_manifest({"classes": CLASSES, "verdict": s})
    d = Judge(spec, 0.9, DEFAULT_SPEC.mean, DEFAULT_SPEC.std).distances(held)
    assert (d <= spec.confident_distance).mean() == pytest.approx(0.8, abs=0.03)
    assert spec.unknown_distance > spec.confident_distance
    assert Judge(spec, 0.9, DEFAULT_SPEC.mean, DEFAULT_SPEC.std).distances(np.array([[40.0, 40.0, 40.0]]))[0] > spec.unknown_distance
    with pytest.raises(ValueError, match="at least 10 held-out photos"):
        fit_verdict(train, y, held[:5], photo_batch(5), DEFAULT_SPEC)


def test_auto_precision_runs_fp32_when_int8_verdicts_disagree_with_fp32(tiny_store, tmp_path):
    from edge_agent.config import parse_config
    from engines.backends.onnxruntime_backend import choose_precision
    from engines.store import EngineStore

    version = EngineStore(tiny_store).open()
    cfg = parse_config({}).engine
    base = {**version.manifest, "verdict": section()}
    base["metrics"] = {**base["metrics"], "int8": {**base["metrics"]["int8"], "top1_agreement_with_fp32": 1.0}}
    check = base["metrics"]["int8"]
    for agreement, expected in (
        (None, "no recorded verdict agreement"),
        (0.95, "gives FP32's verdict on 0.950"),
        (0.99, "agreed with FP32"),
    ):
        m = json.loads(json.dumps(base))
        m["metrics"]["int8"] = {**check, **({"verdict_agreement_with_fp32": agreement} if agreement is not None else {})}
        precision, why = choose_precision(cfg, type(version)(version.name, version.path, m))
        assert expected in why and precision == ("int8" if agreement == 0.99 else "fp32")


def test_a_published_version_carries_its_verdict_and_the_int8_verdict_agreement(tmp_path, signing_key):
    torch = pytest.importorskip("torch")
    from edge_agent.classifier import Classifier
    from edge_agent.config import parse_config
    from engines.loader import open_engine
    from trainer.models import build_model
    from trainer.publish import publish_model
    from trainer.verdict_fit import fit_verdict, logits_of

    torch.manual_seed(0)
    model = build_model(K).eval()
    x = photo_batch(24)
    y = np.arange(24) % K
    logits = logits_of(model, torch.from_numpy(x))
    verdict = fit_verdict(logits, y, logits, x, DEFAULT_SPEC)
    v = publish_model(
        model,
        CLASSES,
        tmp_path,
        calibration=x[:8],
        held_out=(x, y),
        signing_key=signing_key,
        verdict=verdict,
        split={"test": ["a/1.jpg"], "val": [], "train": []},
    )
    assert "verdict_agreement_with_fp32" in v.manifest["metrics"]["int8"]
    assert json.loads(v.artifact("split").read_text())["test"] == ["a/1.jpg"]
    clf = Classifier.configured(open_engine(tmp_path, parse_config({"engine": {"precision": "fp32"}}).engine), parse_config({}))
    assert clf.judge.spec is not None
    pred = clf.predict_bytes(encode(leaf_image(3)))
    assert pred.verdict in ("confident", "unsure", "unknown")
    flat = clf.predict_bytes(encode(np.full((200, 200, 3), 90, np.uint8)))
    assert flat.verdict == "unknown" and flat.verdict_reason == "the photo is nearly one colour"


def test_a_manifest_with_a_malformed_verdict_cannot_be_served(tiny_store, tmp_path):
    from edge_agent.classifier import Classifier
    from edge_agent.config import parse_config
    from engines.loader import open_engine

    engine = open_engine(tiny_store, parse_config({}).engine)
    engine.version.manifest["verdict"] = section(means=[[1.0]])
    with pytest.raises(VerdictSpecError):
        Classifier.configured(engine, parse_config({}))


# ---- what each verdict does to the queue ------------------------------------------------------------


def test_results_from_before_verdicts_keep_their_rows_and_gain_the_column(tmp_path):
    import sqlite3

    from edge_agent.results import ResultsDB

    path = tmp_path / "results.sqlite"
    con = sqlite3.connect(path)
    con.executescript("""CREATE TABLE results (id INTEGER PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE, photo_id TEXT NOT NULL,
        path TEXT, source TEXT NOT NULL, label TEXT NOT NULL, confidence REAL NOT NULL, top_k TEXT NOT NULL,
        engine_version TEXT NOT NULL, timings TEXT NOT NULL, created REAL NOT NULL);
        INSERT INTO results VALUES (1, 'aa', 'aa', '/x.jpg', 'folder', 'Tomato___healthy', 0.95, '[]', 'v0001', '{}', 1.0);""")
    con.commit()
    con.close()
    rows = list(ResultsDB(path).results())
    assert rows[0]["label"] == "Tomato___healthy" and rows[0]["verdict"] is None


def test_crops_restrict_the_answers_to_their_classes_and_a_crop_the_model_lacks_is_refused(tiny_store):
    from edge_agent.classifier import Classifier
    from edge_agent.config import parse_config
    from engines.loader import open_engine

    engine = open_engine(tiny_store, parse_config({"engine": {"precision": "fp32"}}).engine)
    clf = Classifier.configured(engine, parse_config({"classify": {"crops": ["Pepper,_bell", "Orange"]}}))
    preds = [clf.predict_bytes(encode(leaf_image(i))) for i in range(6)]
    assert {p.label.split("___")[0] for p in preds} <= {"Pepper,_bell", "Orange"}
    assert all(len(p.top_k) == 2 and abs(sum(v for _, v in p.top_k) - 1) < 1e-5 for p in preds)
    with pytest.raises(ValueError, match=r"crops = \['Apple'\] names none of v0001's classes"):
        Classifier.configured(engine, parse_config({"classify": {"crops": ["Apple"]}}))


def test_edge_agent_results_says_why_an_answer_is_not_confident_and_reads_a_ledger_kept_before_reasons(tmp_path, capsys):
    """The reason the daemon stored is printed after the photo; a ledger a daemon not yet upgraded wrote (no column
    for reasons, opened read-only) lists its rows with none instead of failing."""
    import sqlite3

    from edge_agent.cli import main
    from edge_agent.ledger_rows import ResultRow
    from edge_agent.results import ResultsDB
    from edge_agent.state import StateLayout

    layout = StateLayout(tmp_path / "state")
    layout.create()
    db = ResultsDB(layout.db)
    why = "further from the training photos than a confident answer may be"
    top_k = [["Apple___Apple_scab", 0.9998]]
    db.commit(
        [
            ResultRow(
                "ab" * 32,
                "p0",
                "/inbox/a.jpg",
                "folder",
                "Apple___Apple_scab",
                0.9998,
                top_k,
                "v4000",
                {},
                verdict="unsure",
                verdict_reason=why,
            )
        ]
    )
    db.close()
    assert main(["results", "--state-dir", str(layout.root)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "not sure: ask an expert (best guess Apple___Apple_scab)" in line and line.endswith(f"({why})")
    with sqlite3.connect(layout.db) as con:
        con.execute("ALTER TABLE results DROP COLUMN verdict_reason")
    assert main(["results", "--json", "--state-dir", str(layout.root)]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["verdict"] == "unsure" and row["verdict_reason"] is None


def test_edge_agent_status_says_how_many_of_each_classs_answers_were_sure(tmp_path, capsys):
    """A class counted by best guess is no finding: the status line says how many of them the model was sure of."""
    from edge_agent.cli import main
    from edge_agent.ledger_rows import ResultRow
    from edge_agent.results import ResultsDB
    from edge_agent.state import StateLayout

    layout = StateLayout(tmp_path / "state")
    layout.create()
    db = ResultsDB(layout.db)
    rows = [("Apple___Apple_scab", "unsure"), ("Apple___Apple_scab", "unknown"), ("Apple___Apple_scab", "confident")]
    rows += [("Apple___healthy", "confident"), ("Apple___healthy", None)]  # None: a result from before verdicts
    db.commit(
        [
            ResultRow(f"{i:064x}", f"p{i}", None, "folder", label, 0.9, [[label, 0.9]], "v4000", {}, verdict=verdict)
            for i, (label, verdict) in enumerate(rows)
        ]
    )
    db.close()
    assert main(["status", "--state-dir", str(layout.root)]) == 0
    out = capsys.readouterr().out
    assert "     3  Apple___Apple_scab  (1 sure)" in out and "     2  Apple___healthy\n" in out
    assert main(["status", "--json", "--state-dir", str(layout.root)]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["per_class"] == {"Apple___Apple_scab": 3, "Apple___healthy": 2}
    assert st["per_class_confident"] == {"Apple___Apple_scab": 1, "Apple___healthy": 2}


def test_edge_agent_results_prints_the_experts_label_and_reads_a_ledger_from_before_expert_labels(tmp_path, capsys):
    import sqlite3

    from edge_agent.cli import main
    from edge_agent.ledger_rows import ResultRow
    from edge_agent.results import ResultsDB
    from edge_agent.state import StateLayout

    layout = StateLayout(tmp_path / "state")
    layout.create()
    db = ResultsDB(layout.db)
    rows = [
        ResultRow(c * 64, f"p{i}", f"/inbox/{i}.jpg", "folder", "Apple___Apple_scab", 0.6, [["Apple___Apple_scab", 0.6]], "v4000", {})
        for i, c in enumerate("ab")
    ]
    db.commit(rows)
    db.mark_expert("b" * 64, "Apple___Black_rot", "")
    db.close()
    assert main(["results", "--state-dir", str(layout.root)]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "expert:" not in first and second.endswith("  expert: Apple___Black_rot")
    assert main(["results", "--json", "--state-dir", str(layout.root)]) == 0
    assert [json.loads(line)["expert_label"] for line in capsys.readouterr().out.splitlines()] == [None, "Apple___Black_rot"]
    with sqlite3.connect(layout.db) as con:
        con.execute("DROP TABLE expert_labels")  # a ledger an older daemon wrote, opened read-only
    assert main(["results", "--json", "--state-dir", str(layout.root)]) == 0
    assert [json.loads(line)["expert_label"] for line in capsys.readouterr().out.splitlines()] == [None, None]
