"""benchmarks.field_verdict's arithmetic: the farm's class centres and the confident rule they are scored with."""

from __future__ import annotations

import numpy as np

from benchmarks.field_verdict import field_centres, judge


def test_a_class_gets_a_field_centre_only_from_two_labelled_photos_or_more():
    logits = np.array([[4.0, 0.0], [6.0, 0.0], [0.0, 5.0]])
    centres, owner = field_centres(logits, np.array([0, 0, 1]), 2)
    assert owner.tolist() == [0] and np.allclose(centres, [[5.0, 0.0]])
    assert field_centres(logits[:1], np.array([0]), 2)[0].shape == (0, 2)


def test_an_answer_is_confident_only_when_sure_enough_and_near_a_centre():
    means, precision = np.array([[5.0, 0.0], [0.0, 5.0]]), np.eye(2)
    logits = np.array([[5.0, 0.0], [0.5, 0.4], [30.0, 0.0]])  # near and sure; unsure; sure but far from every centre
    assert judge(logits, means, precision, 4.0, 0.9).tolist() == [True, False, False]
    far = np.concatenate([means, [[30.0, 0.0]]])  # a second centre where the far photo lies
    assert judge(logits, far, precision, 4.0, 0.9).tolist() == [True, False, True]
