"""A kept loop run's engine on its held-out photos (benchmarks.sure_heldout): sure answers per class, and where every
answer goes per true class."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import sure_heldout
from benchmarks.sure_heldout import confusion, sure_answers

SCAB, RUST, HEALTHY = "Apple___Apple_scab", "Apple___Cedar_apple_rust", "Apple___healthy"


def _q(label: str, verdict: str = "confident", confidence: float = 0.99):
    return SimpleNamespace(label=label, verdict=verdict, confidence=confidence)


ANSWERED = [
    ("a/1.jpg", SCAB, _q(SCAB)),
    ("a/2.jpg", SCAB, _q(HEALTHY, "unsure", 0.6)),
    ("a/3.jpg", SCAB, _q(HEALTHY)),
    ("a/4.jpg", RUST, _q(RUST, "confident", 0.5)),
    ("a/5.jpg", HEALTHY, _q(HEALTHY)),
]


def test_the_confusion_counts_every_answer_per_true_class_sure_or_not_and_its_top1():
    got = confusion(ANSWERED)
    assert got["top1"] == 0.6
    assert got["confusion"] == {HEALTHY: {HEALTHY: 1}, RUST: {RUST: 1}, SCAB: {HEALTHY: 2, SCAB: 1}}
    assert list(got["confusion"][SCAB]) == [HEALTHY, SCAB]  # the most given answer first


def test_no_answers_give_no_top1_rather_than_a_division_by_zero():
    assert confusion([]) == {"top1": None, "confusion": {}}


def test_sure_answers_keep_only_confident_answers_at_trust_from_and_name_each_wrong_photo(monkeypatch, tmp_path):
    monkeypatch.setattr(sure_heldout, "answers", lambda *a, **k: ANSWERED)
    got = sure_answers(tmp_path, "v4002")
    assert got == {SCAB: [1, 1, []], HEALTHY: [2, 1, [("3.jpg", SCAB)]]}  # rust's 0.5 is under trust_from


def test_the_command_prints_the_confusion_of_the_version_serving_at_the_runs_end(monkeypatch, tmp_path, capsys):
    (tmp_path / "report.json").write_text('{"days": [{"engine": "v4001"}, {"engine": "v4002"}]}')
    asked = []
    monkeypatch.setattr(sure_heldout, "answers", lambda seed_dir, v, test=None: asked.append(v) or ANSWERED)
    assert sure_heldout.main([str(tmp_path), "--confusion"]) == 0
    assert asked == ["v4002"]
    assert '"top1": 0.6' in capsys.readouterr().out


@pytest.mark.parametrize("flag", [[], ["--confusion"]])
def test_a_seed_folder_without_its_report_is_a_clear_error(tmp_path, flag):
    with pytest.raises(FileNotFoundError, match="report.json"):
        sure_heldout.main([str(tmp_path), *flag])
