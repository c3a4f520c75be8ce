"""The field loop benchmark's own arithmetic: the split it draws and what its summary counts."""

from __future__ import annotations

import time
import types

import pytest

from benchmarks.field_loop import split_field, summarise

#: the tiny store's answers all sure and checks of them: what makes pseudo-labels once a class is trusted
_SURE_OF_ALL = {"labels": {"pseudo_threshold": 0.01, "trust_confidence": 0.01}}


def _leaf_photos(tmp_path, n: int) -> list[tuple[str, int]]:
    """``n`` leaf photos written as JPEG files, each of class 0: (path, class)."""
    from .conftest import encode, leaf_image

    out = []
    for i in range(n):
        (tmp_path / f"{i}.jpg").write_bytes(encode(leaf_image(i, (180, 160))))
        out.append((str(tmp_path / f"{i}.jpg"), 0))
    return out


def _field(tmp_path, per_class: dict[str, int]):
    for cls, n in per_class.items():
        (tmp_path / cls).mkdir()
        for i in range(n):
            (tmp_path / cls / f"{i}.jpg").write_bytes(f"{cls}-{i}".encode())
    (tmp_path / "Not_a_class").mkdir()
    (tmp_path / "Not_a_class" / "x.jpg").write_bytes(b"x")
    (tmp_path / "A" / "copy.jpg").write_bytes(b"A-0")  # the same bytes under another name: kept once
    return tmp_path


def test_the_field_split_is_stratified_disjoint_deduplicated_and_the_same_for_a_seed(tmp_path):
    root = _field(tmp_path, {"A": 40, "B": 20})
    test, stream = split_field(root, ["A", "B"], seed=1, test_fraction=0.25)
    assert sorted(y for _, y in test) == [0] * 10 + [1] * 5
    assert len(stream) == 45 and not {p for p, _ in test} & {p for p, _ in stream}
    assert all("Not_a_class" not in str(p) and p.name != "copy.jpg" for p, _ in test + stream)
    assert (test, stream) == split_field(root, ["A", "B"], seed=1, test_fraction=0.25)
    assert [p for p, _ in stream] != [p for p, _ in split_field(root, ["A", "B"], seed=2, test_fraction=0.25)[1]]
    assert [y for _, y in stream[:10]] != sorted(y for _, y in stream[:10])  # shuffled across classes


def _day(day, field, published=None, pseudo=None):
    retrain = {"published": published, "reason": "r"} if published is not None else None
    return {
        "day": day,
        "field": field,
        "lab": 0.9,
        "pseudo_labels": 0 if pseudo is None else 5,
        "pseudo_precision": pseudo,
        "expert_labels": 10 * day,
        "retrain": retrain,
    }


def test_the_summary_counts_a_published_version_worse_on_the_field_than_the_one_before():
    from benchmarks._loop_report import markdown

    run = {
        "settings": {"seed": 1},
        "start": {"field": 0.10, "lab": 0.9},
        "days": [_day(1, 0.10), _day(2, 0.40, "v1001"), _day(3, 0.35, "v1002", pseudo=0.8), _day(4, 0.35, "")],
    }
    arm = summarise({"device": [run]})["arms"]["device"]
    assert arm["published"] == 2 and arm["refused"] == 1
    assert arm["published_worse_on_field"] == 1
    assert arm["days"][2]["pseudo_precision_min"] == 0.8 and arm["days"][0]["pseudo_precision_min"] is None
    assert arm["swap_refused"] == 0 and "not adopted" not in markdown(summarise({"device": [run]}), "cmd")
    run["days"][2]["retrain"]["swap"] = {"refused": "agrees with v1001 on 0% of 1 golden photos"}
    summary = summarise({"device": [run]})
    assert summary["arms"]["device"]["swap_refused"] == 1 and "2 / 1 (1 published, not adopted by the device)" in markdown(summary, "cmd")


def test_a_days_pseudo_labels_are_counted_right_apart_for_those_the_review_pool_gave():
    from benchmarks.field_loop import _pseudo_counts

    day = {
        "outcome": [("a", "pseudo", "B"), ("b", "pseudo", "A"), ("c", "review", "A"), ("d", "", "")],
        "from_pool": [("e", "pseudo", "A"), ("f", "pseudo", "A"), ("g", "pseudo", "B")],
    }
    truth = {"a": 1, "b": 1, "e": 0, "f": 1, "g": 1}
    got = _pseudo_counts(day, ["A", "B"], truth)
    assert got == {"pseudo_labels": 5, "pseudo_right": 3, "pseudo_precision": 0.6, "pseudo_from_pool": 3, "pseudo_from_pool_right": 2}
    assert _pseudo_counts({"outcome": [("c", "review", "A")]}, ["A", "B"], truth)["pseudo_from_pool_right"] == 0


def test_the_summary_sums_pseudo_labels_from_the_pool_and_from_new_photos_over_the_seeds_that_recorded_them():
    from benchmarks._loop_report import markdown

    def run(seed, pool=None):
        days = [_day(1, 0.5), _day(2, 0.6, pseudo=0.8)]
        if pool is not None:  # seed 3 is a report from before the pool's share was recorded
            days[1] |= {"pseudo_right": 4, "pseudo_from_pool": pool[1], "pseudo_from_pool_right": pool[0]}
            days[0] |= {"pseudo_right": 0, "pseudo_from_pool": 0, "pseudo_from_pool_right": 0}
        return {"settings": {"seed": seed}, "start": {"field": 0.1, "lab": 0.9}, "days": days}

    summary = summarise({"device": [run(1, (2, 3)), run(2, (1, 1)), run(3)]})
    day2 = summary["arms"]["device"]["days"][1]
    assert (day2["pool_right"], day2["pool_made"], day2["new_right"], day2["new_made"], day2["source_seeds"]) == (3, 4, 5, 6, 2)
    text = markdown(summary, "cmd")
    assert "| 2 | pool 3 of 4 (75%), new 5 of 6 (83%) [2] |" in text and "| 1 | pool -, new - [2] |" in text
    assert "| all | pool 3 of 4 (75%), new 5 of 6 (83%) |" in text
    assert "Where a day's pseudo-labels came from" not in markdown(summarise({"device": [run(3)]}), "cmd")


def test_the_measure_gives_each_engine_the_photos_its_own_manifest_asks_for(tmp_path):
    """v2000 takes 192 px photos: measuring it with the 128 px default once stopped the benchmark before day 1."""
    from benchmarks.field_loop import _Measure
    from edge_agent.config import default_store_path, parse_config
    from edge_agent.state import seed_store
    from engines.store import EngineStore

    from .conftest import encode, leaf_image

    photos = []
    for i in range(3):
        photos.append((tmp_path / f"{i}.jpg", i))
        photos[-1][0].write_bytes(encode(leaf_image(i, (300, 240))))
    seed_store(default_store_path(), tmp_path / "engines")
    store = EngineStore(tmp_path / "engines")
    assert store.open().manifest["preprocess"]["size"] != 128
    figures = _Measure(parse_config({}), photos, photos[:2])(store)
    assert set(figures) == {"field", "lab"} and all(0.0 <= v <= 1.0 for v in figures.values())
    classes = store.open().classes
    apple = [(p, classes.index("Apple___healthy")) for p, _ in photos]
    crops = _Measure(parse_config({"classify": {"crops": ["Apple"]}}), apple, [])(store)  # field_ceiling --crops: no lab set
    assert set(crops) == {"field"} and crops["field"] >= _Measure(parse_config({}), apple, [])(store)["field"]


def test_a_set_value_is_read_as_toml_and_a_malformed_one_or_full_mode_is_refused_with_the_fix(tmp_path):
    from benchmarks._sets import config_sets
    from benchmarks.field_loop import main

    assert config_sets(["trainer.field_check_min=6", 'engine.precision="fp32"', "trainer.unlabelled_term=false"]) == {
        "trainer": {"field_check_min": 6, "unlabelled_term": False},
        "engine": {"precision": "fp32"},
    }
    with pytest.raises(SystemExit, match="SECTION.KEY=VALUE"):
        config_sets(["field_check_min=6"])
    with pytest.raises(SystemExit, match="not TOML.*quotes"):
        config_sets(["engine.precision=fp32"])
    with pytest.raises(SystemExit) as refused:  # the services of full mode run as a new user's, with no configuration
        main(["--out", str(tmp_path), "--mode", "full", "--set", "trainer.field_check_min=6"])
    assert refused.value.code == 2 and not any(tmp_path.iterdir())


def test_the_field_check_replay_judges_each_day_on_the_held_back_photos_of_the_labels_given_so_far(tmp_path, tiny_store, signing_key):
    """A replay that took every label the store holds would judge day 1 on photos its expert had not yet labelled."""
    import shutil

    import torch

    from benchmarks.field_check_replay import replay
    from edge_agent.preprocess import PreprocessSpec, preprocess_file
    from engines.store import EngineStore
    from trainer import photos
    from trainer.field_check import prefer
    from trainer.models import build_model
    from trainer.publish import load_weights, publish_model
    from trainer.samples import SampleStore

    from .conftest import encode, leaf_image

    state = tmp_path / "state"
    shutil.copytree(tiny_store, state / "engines")
    store = EngineStore(state / "engines")
    first = store.current()
    torch.manual_seed(1)
    second = publish_model(build_model(3).eval(), list(store.open().classes), state / "engines", signing_key=signing_key).name
    samples = SampleStore(state / "trainer")
    classes = list(store.open().classes)
    for i in range(12):  # classes in turn; with every 2nd label of a class held back: 3 of the first 8, 6 of all 12
        header = {"id": f"{i:064x}", "kind": "expert", "label": classes[i % 3], "confidence": 1.0, "engine_version": first, "ext": ".jpg"}
        samples.add(header, encode(leaf_image(i, (180, 160))))
    days = [
        {"day": 0, "expert_labels": 0, "published": first, "field": 0.5},
        {"day": 1, "expert_labels": 8, "published": second, "field": 0.6},
    ]
    (row,) = replay(tmp_path, days, every=2)
    assert (row["serving"], row["candidate"], row["held_back"]) == (first, second, 3)
    held = [s for s in sorted(samples.all(), key=lambda s: s.id)[:8] if s.id[-1] in "345"]
    spec = PreprocessSpec.from_manifest(store.open(first).manifest["preprocess"])
    x = photos.stack([photos.photo(preprocess_file(s.file, spec)) for s in held])
    y = torch.tensor([classes.index(s.label) for s in held])
    _, f = prefer(load_weights(store.open(second)), load_weights(store.open(first)), x, y)
    assert (row["right_candidate"], row["right_serving"]) == (round(f["field_top1_with"] * 3), round(f["field_top1_without"] * 3))
    assert (row["log_loss_candidate"], row["log_loss_serving"]) == (f["field_log_loss_with"], f["field_log_loss_without"])
    assert (row["field_serving"], row["field_candidate"]) == (0.5, 0.6)


def test_set_values_join_a_section_without_dropping_its_other_keys_or_changing_the_given_sections():
    from benchmarks._sets import with_sets

    arm = {"trainer": {"unlabelled_term": False}, "handoff": {"unlabelled_per_day": 0}}
    got = with_sets(arm, {"trainer": {"micro_batch": 8, "unlabelled_term": True}, "labels": {"trust_window": 40}})
    assert got == {
        "trainer": {"unlabelled_term": True, "micro_batch": 8},
        "handoff": {"unlabelled_per_day": 0},
        "labels": {"trust_window": 40},
    }
    assert arm == {"trainer": {"unlabelled_term": False}, "handoff": {"unlabelled_per_day": 0}}
    assert with_sets({}, None) == {}


def test_a_days_verdicts_count_only_confident_answers_at_trust_from_as_covered_and_score_them_against_the_truth(tmp_path):
    """The tally that says why no pseudo-label was made: unknown and unsure answers, or sure ones that were wrong."""
    import json

    from benchmarks._loop_report import markdown
    from benchmarks._loop_verdicts import day_verdicts, fill_verdicts
    from edge_agent.config import LabelsSection
    from edge_agent.ledger_rows import ResultRow
    from edge_agent.results import ResultsDB

    classes = ["A", "B"]
    answers = [  # (said, confidence, verdict, truth)
        ("A", 0.99, "confident", 0),  # covered, right
        ("A", 0.995, "confident", 1),  # covered, wrong
        ("B", 0.95, "confident", 1),  # confident but below trust_from (0.98): not covered
        ("B", 0.99, "unsure", 1),  # sure but unsure (its distance): not covered
        ("A", 0.3, "unknown", 0),
    ]
    db = ResultsDB(tmp_path / "results.sqlite")
    shas = [f"{i:064x}" for i in range(len(answers))]
    db.commit(
        [ResultRow(sha, sha[:16], None, "inbox", said, p, [[said, p]], "v1", {}, verdict=v) for sha, (said, p, v, _) in zip(shas, answers)],
        [],
    )
    db.close()
    truth = {sha: t for sha, (*_, t) in zip(shas, answers)}
    v = day_verdicts(tmp_path / "results.sqlite", shas[:4], truth, classes, LabelsSection())
    assert (v["confident"], v["unsure"], v["unknown"]) == (3, 1, 0)
    assert (v["covered"], v["covered_right"], v["covered_precision"], v["trusted"]) == (2, 1, 0.5, [])

    photos = []
    for i in range(len(answers)):  # a stream whose files hash to nothing in the database still counts nothing
        (tmp_path / f"{i}.jpg").write_bytes(bytes([i]))
        photos.append((tmp_path / f"{i}.jpg", 0))
    report = {"settings": {"day_size": 2}, "classes": classes, "days": [{"day": 1}, {"day": 2, "verdicts": {"kept": True}}]}
    assert fill_verdicts(report, tmp_path, photos, {}, LabelsSection())
    assert report["days"][0]["verdicts"]["covered"] == 0 and report["days"][0]["verdicts"]["trusted"] is None
    assert report["days"][1]["verdicts"] == {"kept": True}  # a day that recorded its own is left as it was
    assert not fill_verdicts(report, tmp_path / "no-state", photos, {}, LabelsSection())

    run = {
        "settings": {"seed": 1},
        "start": {"field": 0.1, "lab": 0.9},
        "days": [_day(1, 0.1) | {"verdicts": v}, _day(2, 0.5) | {"verdicts": v | {"covered": 4, "covered_right": 4}}],
    }
    summary = summarise({"device": [run]})
    assert [d["covered_precision"] for d in summary["arms"]["device"]["days"]] == [0.5, 1.0]
    text = markdown(json.loads(json.dumps(summary)), "cmd")
    assert "| 1 | 2.0 (50% right), unknown 0.0 [1] |" in text and "| 2 | 4.0 (100% right)" in text


def test_the_unlabelled_terms_labels_are_scored_against_the_truth_while_a_retrain_runs_and_summarised_per_day():
    import torch

    from benchmarks._loop_report import markdown
    from benchmarks.field_loop import _term_labels
    from trainer.loop import second_candidate
    from trainer.loop.unlabelled_term import Term
    from trainer.strategies.base import Generation

    given = Generation(torch.zeros(3, 3, 4, 4), torch.tensor([1, 2, 0]), sample_ids=["a", "b", "z"])
    real = second_candidate.teach
    second_candidate.teach = lambda *a, **k: Term(given, {"taken": 3})
    try:
        with _term_labels({"a": 1, "b": 0}) as taken:  # "z": a photo the benchmark does not know is not scored
            assert second_candidate.teach().data is given
        assert second_candidate.teach is not real and taken == {"taken_known": 2, "taken_right": 1}
    finally:
        second_candidate.teach = real
    with _term_labels({}) as untouched:
        pass
    assert second_candidate.teach is real and untouched == {}  # put back; nothing scored without a term

    def run(seed, kept):
        day = _day(2, 0.5, "v1001")
        day["retrain"]["unlabelled"] = {"pool_photos": 100 * seed, "taken_known": 10 * seed, "taken_right": 9 * seed - 1, "kept": kept}
        return {"settings": {"seed": seed}, "start": {"field": 0.1, "lab": 0.9}, "days": [_day(1, 0.1), day]}

    summary = summarise({"device": [run(1, True), run(2, False)]})
    day2 = summary["arms"]["device"]["days"][1]
    assert (day2["term_runs"], day2["term_pool"], day2["term_taken"], day2["term_kept"]) == (2, 150, 15, 1)
    assert (day2["term_precision"], day2["term_precision_min"]) == (0.8333, 0.8)  # 25 of 30 pooled; the worst retrain 8 of 10
    assert "term_runs" not in summary["arms"]["device"]["days"][0]
    assert "| 2 | 15 of 150 (83% right, worst 80%), kept 1 [2] |" in markdown(summary, "cmd")


def test_the_field_checks_decisions_are_scored_on_the_held_out_photos_while_a_retrain_runs_and_a_refused_better_candidate_is_counted():
    """The field check judges on a few held-back photos; the benchmark scores each candidate it judged (and the version
    in service) on the held-out photos the trainer never sees, to show when the check refuses a better candidate."""
    from benchmarks._loop_report import markdown
    from benchmarks.field_loop import _judged
    from trainer import retrain as retrain_mod
    from trainer.field_check import FieldDecision

    measure = types.SimpleNamespace(field_top1=lambda model, spec: model.held_out)
    served, better, worse = (types.SimpleNamespace(held_out=v) for v in (0.73, 0.78, 0.70))

    def check(candidate, previous, *a):
        return FieldDecision(False, "field check: top-1 9 of 13 < 12", {"field_photos": 13})

    real, retrain_mod.field_gate = retrain_mod.field_gate, check
    try:
        with _judged(measure, spec=None) as judged:
            assert not retrain_mod.field_gate(better, served, "x", "y").publish  # the check's own decision is returned
        assert judged == [{"candidate": 0.78, "in_service": 0.73, "passed": False, "photos": 13}]
        assert retrain_mod.field_gate is check  # put back after the retrain
        with _judged(measure, spec=None) as untouched:
            pass
        retrain_mod.field_gate(worse, served)  # after the retrain: nothing more is scored
        assert untouched == [] and retrain_mod.field_gate is check
    finally:
        retrain_mod.field_gate = real

    def run(seed, judged):
        day = _day(2, 0.73, "")
        day["retrain"]["judged"] = judged
        return {"settings": {"seed": seed}, "start": {"field": 0.1, "lab": 0.9}, "days": [_day(1, 0.1), day]}

    refused_better = {"candidate": 0.78, "in_service": 0.73, "passed": False}
    refused_worse = {"candidate": 0.70, "in_service": 0.73, "passed": False}
    passed_worse = {"candidate": 0.72, "in_service": 0.73, "passed": True}
    summary = summarise({"device": [run(1, [refused_better, passed_worse]), run(2, [refused_worse])], "none": [run(1, [])]})
    assert summary["arms"]["device"]["field_check"] == {
        "passed": 1,
        "passed_worse": 1,
        "refused": 2,
        "refused_better": 1,
        "refused_gain": [0.05, -0.03],
    }
    assert "field_check" not in summary["arms"]["none"]  # nothing judged: no figures made up
    assert "| device | 1 (1) | 2 (1) | +0.050, -0.030 |" in markdown(summary, "cmd")


def test_each_benchmark_day_hands_over_its_own_share_of_unlabelled_photos_though_the_days_share_one_wall_clock_day(tmp_path, tiny_store):
    """The fast loop's days pass in minutes: a share counted from local midnight gave the trainer the first day's
    photos only (the pool of every v4000 loop run held about 90 photos, all from day 1)."""
    from benchmarks.field_loop import LoopSettings, _FastDevice

    photos = _leaf_photos(tmp_path, 12)
    s = LoopSettings(arm="none", store=str(tiny_store), overrides={"handoff": {"unlabelled_per_day": 4}})
    device = _FastDevice(s, tmp_path / "run", truth={})
    try:
        pooled = []
        for day in (photos[:6], photos[6:]):
            device.day(day)
            pooled.append(len(device.unlabelled.photos()))
    finally:
        device.close()
    assert pooled == [4, 8]


def test_the_fast_loop_adopts_a_published_version_only_as_the_daemons_hot_swap_would(tmp_path, tiny_store, monkeypatch):
    """The fast loop used to measure whatever the trainer published; the daemon's swap refused v4000's first orchard
    retrain (fixed since), which only the full mode showed. A refused version goes out of service again."""
    from benchmarks.field_loop import LoopSettings, _FastDevice
    from edge_agent import hotswap

    from .conftest import encode, leaf_image

    (tmp_path / "0.jpg").write_bytes(encode(leaf_image(0, (180, 160))))
    s = LoopSettings(arm="none", store=str(tiny_store), overrides={"labels": {"pseudo_threshold": 0.01}})
    device = _FastDevice(s, tmp_path / "run", truth={})
    try:
        serving = device.serving
        device.classify([(str(tmp_path / "0.jpg"), 0)])
        assert len(device.golden) == 1  # its confident answer, as the pipeline keeps it
        src, m = device.store.root / serving, device.store.read_manifest(serving)
        files = {f.name: f for f in src.iterdir() if f.is_file() and f.name in m["files"]}
        device.store.publish(files, {k: v for k, v in m.items() if k not in ("version", "files", "created", "parent")})  # a retrain's
        published = device.store.current()
        assert published != serving

        def refuse(*a, **k):
            raise hotswap.SwapRefused("agrees with it on 0% of 1 golden photos")

        monkeypatch.setattr(hotswap, "verify_candidate", refuse)
        assert device.adopt(published) == {"refused": "agrees with it on 0% of 1 golden photos"}
        assert device.store.current() == serving == device.serving  # the daemon keeps serving the one before
        monkeypatch.setattr(hotswap, "verify_candidate", lambda new, ref, name, golden, m: {"golden": len(golden), "agreement": 1.0})
        assert device.adopt(published) == {"golden": 1, "agreement": 1.0}
        assert device.serving == published and not device.golden  # golden photos come from the engine in service
    finally:
        device.close()


def test_the_full_loop_measures_the_version_the_daemon_serves_and_reads_a_refused_swap_from_its_status(tmp_path):
    """A refused version is the store's current but not what the daemon serves: the day is measured on the latter."""
    import json

    from benchmarks.field_loop import _FullDevice

    device = _FullDevice.__new__(_FullDevice)
    device.state = tmp_path
    device.store = types.SimpleNamespace(current=lambda: "v4001")
    assert device.serving == "v4001" and device._refused() == {}  # no status yet: the store's word
    status = {"engine": {"engine_version": "v4000"}, "hotswap": {"refused": {"v4001": "agrees with v4000 on 0% of 1 golden photos"}}}
    (tmp_path / "status.json").write_text(json.dumps(status))
    assert device.serving == "v4000" and device._refused() == {"v4001": "agrees with v4000 on 0% of 1 golden photos"}


def test_the_fast_loop_makes_pseudo_labels_of_the_pool_photos_a_class_trusted_since_covers(tmp_path, tiny_store, monkeypatch):
    """As the daemon's idle inference thread does once the expert's labels earn a class trust."""
    from benchmarks.field_loop import LoopSettings, _FastDevice

    photos = _leaf_photos(tmp_path, 4)
    device = _FastDevice(LoopSettings(arm="device", store=str(tiny_store), overrides=_SURE_OF_ALL), tmp_path / "run", truth={})
    try:
        outcome = device.classify(photos)
        sure = [(sha, label) for sha, kind, label in outcome if kind == "review"]
        assert sure and device.pool_to_pseudo() == []  # no class trusted: they wait as checks
        monkeypatch.setattr(device.queuer.trust, "trusted_classes", lambda: None)  # (every class trusted since)
        monkeypatch.setattr(device.queuer.trust, "now", lambda: lambda label: True)
        made = device.pool_to_pseudo()
        assert sorted(made) == sorted((sha, "pseudo", label) for sha, label in sure)
        assert {e.sha256 for e in device.db.queued_for_delivery(10)} == {sha for sha, _ in sure}
    finally:
        device.close()


def test_the_fast_loop_records_its_delivered_pseudo_labels_and_withdraws_them_from_the_trainer_as_the_daemon_does(
    tmp_path, tiny_store, monkeypatch
):
    """The fast loop handed pseudo-labels over without recording them as delivered and never ran the withdrawal
    step: a class the expert found wrong kept its delivered pseudo-labels in the trainer, and a replay of a run
    (``benchmarks.held_back_checks``) found none to judge. Withdrawn now as the daemon and the trainer do it."""
    from benchmarks.field_loop import LoopSettings, _FastDevice, _withdrawn_since
    from edge_agent.results import query_readonly
    from edge_agent.review import withdraw
    from edge_agent.review.queue import label_photo

    photos = _leaf_photos(tmp_path, 5)
    device = _FastDevice(LoopSettings(arm="device", store=str(tiny_store), overrides=_SURE_OF_ALL), tmp_path / "run", truth={})
    try:
        sure = [(sha, label) for sha, kind, label in device.classify(photos) if kind == "review"]
        assert len(sure) >= 2
        classes = device.store.open().classes
        label_photo(device.db, device.state / "queue", 1 << 30, classes, sure[0][0], sure[0][1])  # a check, right
        monkeypatch.setattr(device.queuer.trust, "trusted_classes", lambda: None)
        monkeypatch.setattr(device.queuer.trust, "now", lambda: lambda label: True)
        made = device.pool_to_pseudo()
        device.hand_over()
        ids = {sha for sha, _, _ in made}
        assert ids and {x.id for x in device.samples.all() if x.kind == "pseudo"} == ids
        sent = query_readonly(device.state / "results.sqlite", "SELECT sha256 FROM pseudo_sent")
        assert {sha for (sha,) in sent} == ids  # recorded as delivered, as the sender records them
        started = time.time()
        version = device.serving
        monkeypatch.setattr(withdraw, "found_wrong", lambda new, checks, policy: sorted({(label, version) for _, _, label in made}))
        device.withdraw()
        device.hand_over()
        assert not [x for x in device.samples.all() if x.kind == "pseudo"]  # no longer trained on
        assert {p.id for p in device.unlabelled.photos()} >= ids  # kept as photos nobody labelled
        assert device.db.withdrawals_due(10) == [] and _withdrawn_since(device.state / "results.sqlite", started) == len(ids)
    finally:
        device.close()
