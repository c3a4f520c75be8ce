"""What a field loop's device answered each day, read from its results database: why pseudo-labels were (not) made.

A pseudo-label needs three things at once: a ``confident`` verdict, an answer at ``[labels] trust_from`` or surer
(an answer trust covers, so a *check* when the expert labels it), and a trusted class. :func:`day_verdicts` counts
the first two on a day's photos, with how many of the covered answers were right (their precision is what trust
has to find), and which classes were trusted at the end of the day.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["day_verdicts", "fill_verdicts"]


def day_verdicts(db: Path, shas: list[str], truth: dict[str, int], classes: list[str], policy) -> dict:
    """The day's photos (``shas``) by verdict as first answered; the answers trust covers, and how many were right;
    the classes trusted by the expert's checks so far (``policy``: the ``[labels]`` section)."""
    from edge_agent.results import ResultsDB, query_readonly
    from edge_agent.review.checks import class_trust, covered

    marks = ",".join("?" * len(shas))
    rows = query_readonly(db, f"SELECT sha256, label, confidence, verdict FROM results WHERE sha256 IN ({marks})", shas)
    counts = {"confident": 0, "unsure": 0, "unknown": 0}
    cover = right = 0
    for sha, label, confidence, verdict in rows:
        counts[verdict or "unsure"] = counts.get(verdict or "unsure", 0) + 1
        if covered(verdict, confidence, policy):
            cover += 1
            right += label in classes and classes.index(label) == truth.get(sha)
    results = ResultsDB(db, readonly=True)
    try:
        trusted = sorted(label for label, t in class_trust(results, policy).items() if t.trusted)
    finally:
        results.close()
    return {
        **counts,
        "covered": cover,
        "covered_right": right,
        "covered_precision": round(right / cover, 4) if cover else None,
        "trusted": trusted,
    }


def fill_verdicts(report: dict, state: Path, stream: list, truth: dict[str, int], policy) -> bool:
    """Add :func:`day_verdicts` to a report's days that lack it, from the run's kept state directory (runs made
    before the days recorded it); False where there is no state to read."""
    import hashlib

    db = state / "results.sqlite"
    if not db.is_file():
        return False
    size = report["settings"]["day_size"]
    changed = False
    for row in report["days"]:
        if "verdicts" not in row:
            photos = stream[(row["day"] - 1) * size : row["day"] * size]
            shas = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p, _ in photos]
            row["verdicts"] = day_verdicts(db, shas, truth, report["classes"], policy)
            if row is not report["days"][-1]:
                row["verdicts"]["trusted"] = None  # the state holds trust as it stood at the end of the last day only
            changed = True
    return changed
