"""The label policy without threads: what decide() chooses, and the per-class cap and quota of LabelQueuer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edge_agent.classifier import Prediction
from edge_agent.config import LabelsSection
from edge_agent.labelling import LabelQueuer, decide
from edge_agent.results import ResultsDB
from edge_agent.spool import PhotoSpool


@pytest.mark.parametrize(
    "verdict, confidence, queued",
    [
        ("confident", 0.99, "pseudo"),
        ("confident", 0.95, "review"),  # below trust_confidence (0.98): trust does not cover it, it waits in the pool
        ("confident", 0.85, None),  # confident by the verdict, below pseudo_threshold, above review_threshold (0.8 here)
        ("unsure", 0.97, "review"),  # sure by the softmax, refused for its distance: the expert decides
        ("unsure", 0.40, "review"),
        ("unsure", 0.85, None),
        ("unknown", 0.99, "review"),
    ],
)
def test_only_confident_answers_become_pseudo_labels(verdict, confidence, queued):
    assert decide(verdict, confidence, LabelsSection(pseudo_threshold=0.9, review_threshold=0.8)) == queued


def test_with_the_default_policy_every_answer_that_is_not_confident_goes_to_review():
    policy = LabelsSection()
    assert {decide("unsure", c / 100, policy) for c in range(1, 100)} == {"review"}


@dataclass
class _Answer:
    sha256: str
    prediction: Prediction
    data: bytes = b"\xff\xd8\xff photo"
    ext: str = ".jpg"
    origin: None = None

    @property
    def photo_id(self) -> str:
        return self.sha256[:16]


def _answers(labels, confidence=0.99, verdict="confident", start=0):
    return [
        _Answer(f"{start + i:064x}", Prediction(label, confidence, [(label, confidence)], "v0001", verdict=verdict))
        for i, label in enumerate(labels)
    ]


@pytest.fixture
def queuer(tmp_path):
    def make(quota=1 << 20, **policy):
        db = ResultsDB(tmp_path / "results.sqlite")
        return LabelQueuer(db, PhotoSpool(tmp_path / "queue", quota), LabelsSection(**{"trust_checks": 0, **policy})), db

    return make


def test_the_cap_holds_within_one_batch_and_across_batches(queuer):
    q, db = queuer(per_class_cap=2)
    first = q.queue(_answers(["a"] * 5 + ["b"]))
    assert sorted(first.kinds.values()) == ["pseudo"] * 3 and len(first.entries) == 3
    db.commit([], first.entries)
    second = q.queue(_answers(["a", "b", "b"], start=10))
    assert [e.label for e in second.entries] == ["b"]


def test_the_cap_is_read_back_from_the_database_for_an_engine_version(queuer):
    q, db = queuer(per_class_cap=1)
    db.commit([], q.queue(_answers(["a"])).entries)
    again, _ = queuer(per_class_cap=1)  # a restart
    assert again.queue(_answers(["a", "b"], start=5)).kinds == {f"{6:064x}": "pseudo"}


def test_photos_the_quota_leaves_out_are_counted_and_free_their_place_under_the_cap(queuer):
    q, _ = queuer(quota=12, per_class_cap=2)  # room for one 9-byte photo
    out = q.queue(_answers(["a", "a"]))
    assert out.skipped == 1 and len(out.entries) == 1 and q.full
    q.spool.max_bytes = 1 << 20  # room again: the photo left out did not take a place under the cap
    assert len(q.queue(_answers(["a", "a"], start=3)).entries) == 1 and not q.full


def test_a_duplicate_found_at_commit_no_longer_counts_and_recount_rereads_the_database(queuer):
    q, db = queuer(per_class_cap=1)
    [answer] = _answers(["a"])
    out = q.queue([answer])
    q.not_committed(answer, out.kinds[answer.sha256])  # the commit said: seen before
    assert len(q.queue(_answers(["a"], start=1)).entries) == 1
    q.recount()  # nothing was committed: the database counts none
    assert len(q.queue(_answers(["a"], start=2)).entries) == 1


def test_review_photos_are_not_capped(queuer):
    q, _ = queuer(per_class_cap=0)
    out = q.queue(_answers(["a"] * 4, confidence=0.3, verdict="unsure"))
    assert list(out.kinds.values()) == ["review"] * 4
