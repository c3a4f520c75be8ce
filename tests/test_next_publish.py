"""The loop says what it waits for: the fewest expert labels that let the next version be published, by class, in
words; `edge-trainer status` in sentences; `edge-trainer retrain` says so up front instead of spending the CPU."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from edge_agent.config import LabelsSection
from edge_agent.trainer_config import TrainerSection
from trainer.field_check import held_back
from trainer.loop.next_publish import plan
from trainer.samples import Sample, SampleStore

_n = iter(range(10**6))


def _sample(label: str, kind: str = "expert") -> Sample:
    i = next(_n)
    return Sample(f"{i:064x}", kind, label, 1.0, "v2000", "", 1000.0 + i, None)


def _counts(samples: list[Sample]) -> dict:
    experts = sum(s.kind == "expert" for s in samples)
    return {"pseudo": len(samples) - experts, "expert": experts, "new": len(samples), "new_expert": experts}


def test_a_days_ten_labels_say_how_many_more_and_of_which_classes_fill_the_field_check():
    tc = TrainerSection(field_check_min=8)  # every 4th label of a class held back, 8 needed
    samples = [_sample("Apple___Apple_scab") for _ in range(4)] + [_sample("Apple___Cedar_apple_rust") for _ in range(3)]
    samples += [_sample("Apple___healthy") for _ in range(3)]
    nxt = plan(samples, _counts(samples), tc)
    assert nxt.waiting_for == "field_check" and "holds 1 of the 8 photos" in nxt.sentence
    assert nxt.by_class["Apple___Cedar_apple_rust"] >= 1 and "Cedar apple rust (Apple)" in nxt.sentence
    after = samples + [_sample(c) for c, k in nxt.by_class.items() for _ in range(k)]  # the expert does as told
    assert len(held_back(after, tc.field_check_every)) >= tc.field_check_min
    assert nxt.expert_labels_needed == sum(nxt.by_class.values()) == 22  # 7 more held-back photos: 1 + 1 + 5 x 4
    assert max(nxt.by_class.values()) <= 9  # spread over the classes, not all of one
    assert "22 more expert labels of any class" in nxt.sentence and "soonest" in nxt.sentence and "at least" not in nxt.sentence
    other = samples + [_sample("Grape___healthy") for _ in range(4)]  # a class the plan did not name still fills it
    assert len(held_back(other, tc.field_check_every)) == 2


def test_a_label_put_right_counts_where_it_arrived_and_the_plan_asks_only_for_the_classes_the_labels_name_now():
    from dataclasses import replace

    tc = TrainerSection(field_check_min=1)
    scab = [_sample("Apple___Apple_scab") for _ in range(3)]
    moved = [replace(s, label="Apple___Black_rot", first_label="Apple___Apple_scab") for s in scab]  # each put right
    nxt = plan(moved, _counts(moved), tc)
    # black rot's order has no place taken: its 4th label is the first held back (by label alone: 1 more)
    assert nxt.by_class == {"Apple___Black_rot": 4} and "Apple scab" not in nxt.sentence
    after = moved + [_sample("Apple___Black_rot") for _ in range(4)]
    assert len(held_back(after, tc.field_check_every)) == 1 and not held_back(moved + after[3:6], tc.field_check_every)


def test_before_any_expert_label_it_says_how_many_samples_or_labels_the_next_retrain_needs():
    samples = [_sample("Apple___healthy", "pseudo") for _ in range(50)]
    nxt = plan(samples, _counts(samples), TrainerSection())
    assert nxt.waiting_for == "expert_labels" and nxt.sentence.startswith("10 more expert labels or 150 more samples")
    due = [_sample("Apple___healthy", "pseudo") for _ in range(200)]
    assert plan(due, _counts(due), TrainerSection()).waiting_for == "nothing"


def test_the_sentence_counts_one_label_one_sample_and_the_held_back_label_in_plain_english():
    from edge_agent.names import ordinal

    samples = [_sample("Apple___healthy", "pseudo") for _ in range(199)]
    assert plan(samples, _counts(samples), TrainerSection()).sentence.startswith("10 more expert labels or 1 more sample (")
    samples = [_sample("Apple___healthy") for _ in range(9)]
    nxt = plan(samples, _counts(samples), TrainerSection(field_check_every=3, field_check_min=4))
    assert "(every 3rd label of a class" in nxt.sentence and nxt.sentence.startswith("3 more expert labels of any class")
    samples += [_sample("Apple___healthy") for _ in range(2)]
    nxt = plan(samples, _counts(samples), TrainerSection(field_check_every=3, field_check_min=4))
    assert nxt.sentence.startswith("1 more expert label of any class")  # (the 12th: 4 held back)
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"
    ]  # fmt: skip


def _store_with(root, labels: list[str]) -> None:
    store = SampleStore(root)
    for i, label in enumerate(labels):
        data = f"{label}{i}".encode()
        header = {"id": hashlib.sha256(data).hexdigest(), "kind": "expert", "label": label, "confidence": 1.0}
        store.add({**header, "engine_version": "v2000", "ext": ".jpg"}, data)
    store.close()


def test_edge_trainer_status_speaks_in_sentences_without_python_dicts_or_contradictions(tmp_path, capsys):
    pytest.importorskip("torch", reason="the trainer's command line")
    from trainer.cli import main

    root = tmp_path / "state" / "trainer"
    root.mkdir(parents=True)
    st = {
        "pid": os.getpid(),
        "updated": time.time(),
        "state": "idle",
        "samples": {"pseudo": 0, "expert": 10, "new": 10, "new_expert": 10},
        "retrain_threshold": 200,
        "next_publish": {"sentence": "26 more expert labels, at least ...", "waiting_for": "field_check", "by_class": {"A___b": 3}},
        "labelled": {
            "replay_photos": 303,
            "validation_photos": 672,
            "origin": "shipped",
            "problems": ["1 labelled photo(s) could not be read"],
        },
        "last_retrain": {
            "published": None,
            "reason": "refused by the gate",
            "metrics": {"gate": {"candidate_top1": 0.9, "current_top1": 0.91, "field": {}}},
        },
    }
    (root / "status.json").write_text(json.dumps(st))
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "{'" not in out and "0 pseudo-labels and 10 expert labels" in out and "next: 26 more expert labels" in out
    assert "true labels: 303 to replay, 672 for the gate (shipped)\n  problem: 1 labelled photo(s) could not be read" in out
    assert "no expert labels yet" not in out  # the last gate ran before them: said so, not contradicted


def test_a_stopped_trainers_status_says_when_it_last_wrote_and_that_a_due_retrain_waits_for_it_to_run(tmp_path, capsys):
    """It said "a retrain is due: it starts when the trainer is free" of a trainer that was not running at all."""
    pytest.importorskip("torch", reason="the trainer's command line")
    from trainer.cli import main

    root = tmp_path / "state" / "trainer"
    root.mkdir(parents=True)
    due = {"sentence": "a retrain is due: it starts when the trainer is free", "waiting_for": "nothing"}
    for pid, updated in ((0, time.time() - 2 * 86400 - 60), (os.getpid(), time.time())):
        st = {"pid": pid, "updated": updated, "state": "idle", "samples": {"expert": 30, "new": 30}, "next_publish": due}
        (root / "status.json").write_text(json.dumps(st))
        assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
        out = capsys.readouterr().out
        if pid:
            assert out.startswith("trainer: running, idle\n") and "next: a retrain is due: it starts when the trainer is free" in out
        else:
            assert out.startswith(
                "trainer: not running (edge-trainer serve, or systemctl start edge-trainer); it last wrote its status 2 days ago\n"
            )
            assert "next: a retrain is due: it starts when the trainer runs\n" in out


def test_edge_trainer_retrain_says_up_front_that_no_candidate_could_be_published_and_spends_nothing(tmp_path, capsys):
    pytest.importorskip("torch", reason="the trainer's command line")
    from trainer.cli import main

    _store_with(tmp_path / "state" / "trainer", ["Apple___Apple_scab"] * 10)
    started = time.monotonic()
    assert main(["retrain", "--state-dir", str(tmp_path / "state")]) == 1
    out = capsys.readouterr().out
    assert "could not be published yet" in out and "more expert labels" in out and "--force" in out
    assert time.monotonic() - started < 5


def test_the_review_queue_asks_first_about_the_classes_the_next_publish_waits_for(tmp_path):
    from edge_agent.ledger_rows import QueueEntry, ResultRow
    from edge_agent.results import ResultsDB
    from edge_agent.review.queue import to_ask

    db = ResultsDB(tmp_path / "results.sqlite")
    rows, entries = [], []
    for i, label in enumerate(["Apple___healthy"] * 6 + ["Apple___Cedar_apple_rust"] * 2):
        sha = hashlib.sha256(str(i).encode()).hexdigest()
        f = tmp_path / f"{sha}.jpg"
        f.write_bytes(b"x")
        top_k = [[label, 0.5 - i / 100], ["Apple___Apple_scab", 0.3]]
        rows.append(ResultRow(sha, sha[:16], None, "inbox", label, top_k[0][1], top_k, "v2000", {}, verdict="unsure"))
        entries.append(QueueEntry(sha, sha[:16], "review", label, top_k[0][1], "v2000", str(f), 1))
    db.commit(rows, entries)
    first = to_ask(db, 3, LabelsSection(), wanted={"Apple___Cedar_apple_rust"})
    assert [it.entry.label for it in first[:2]] == ["Apple___Cedar_apple_rust"] * 2 and len(first) == 3


def test_checks_of_other_classes_still_alternate_with_the_photos_the_next_publish_waits_for(tmp_path):
    """A trainer waiting for cedar-rust labels must not starve the checks that earn a class trust (the full-mode
    field loop asked 21 checks in 90 questions when it did): wanted photos lead within each part, and the parts alternate."""
    from edge_agent.ledger_rows import QueueEntry, ResultRow
    from edge_agent.results import ResultsDB
    from edge_agent.review.queue import to_ask

    db = ResultsDB(tmp_path / "results.sqlite")
    rows, entries = [], []
    photos = [("Apple___Cedar_apple_rust", "unsure")] * 4 + [("Apple___healthy", "confident")] * 3 + [("Apple___Black_rot", "unsure")] * 2
    for i, (label, verdict) in enumerate(photos):
        sha = hashlib.sha256(f"p{i}".encode()).hexdigest()
        f = tmp_path / f"{sha}.jpg"
        f.write_bytes(b"x")
        top_k = [[label, (0.99 if verdict == "confident" else 0.5) - i / 1000], ["Apple___Apple_scab", 0.03]]
        rows.append(ResultRow(sha, sha[:16], None, "inbox", label, top_k[0][1], top_k, "v2000", {}, verdict=verdict))
        entries.append(QueueEntry(sha, sha[:16], "review", label, top_k[0][1], "v2000", str(f), 1))
    db.commit(rows, entries)
    asked = to_ask(db, 6, LabelsSection(), wanted={"Apple___Cedar_apple_rust"})
    assert [(it.entry.label, it.check) for it in asked] == [
        ("Apple___healthy", True),
        ("Apple___Cedar_apple_rust", False),
        ("Apple___healthy", True),
        ("Apple___Cedar_apple_rust", False),
        ("Apple___healthy", True),
        ("Apple___Cedar_apple_rust", False),
    ]


def test_what_the_next_publish_waits_for_is_read_again_when_a_label_is_corrected_though_no_count_changes(tmp_path):
    pytest.importorskip("torch", reason="the trainer's service")
    from edge_agent.config import AppConfig
    from trainer.service import TrainerService

    service = TrainerService.__new__(TrainerService)  # what the status needs of it, not its sockets
    service.cfg, service.state, service._plan = AppConfig(), "idle", ((), {})
    service.samples = SampleStore(tmp_path)
    header = {"id": "a" * 64, "kind": "expert", "label": "Apple___Apple_scab", "confidence": 1.0, "engine_version": "v2000", "ext": ".jpg"}
    service.samples.add(header, b"photo")
    assert "of Apple scab (Apple)" in service._next_publish(service.samples.counts())["sentence"]
    assert service.samples.add({**header, "label": "Apple___Black_rot"}, b"photo")  # a slip put right: the counts stay
    sentence = service._next_publish(service.samples.counts())["sentence"]
    assert "of Black rot (Apple)" in sentence and "Apple scab" not in sentence
    service.samples.close()


def test_edge_trainer_status_says_how_many_labels_the_expert_put_right(tmp_path, capsys):
    pytest.importorskip("torch", reason="the trainer's command line")
    from trainer.cli import main

    root = tmp_path / "state" / "trainer"
    root.mkdir(parents=True)
    st = {"pid": os.getpid(), "updated": time.time(), "state": "idle", "samples": {"expert": 3, "new": 1, "new_expert": 1}}
    (root / "status.json").write_text(json.dumps({**st, "labels_corrected": 2}))
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    assert "(1 of them expert labels); 2 put right by the expert since the start\n" in capsys.readouterr().out
    (root / "status.json").write_text(json.dumps(st))
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    assert "put right" not in capsys.readouterr().out
