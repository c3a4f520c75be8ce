"""What the review pool costs the daemon after a swap: a full pool (2,000 photos: ``[labels] review_pool``) answered
again by the engine in service, a batch at a time as the idle inference thread does, and the pass that makes
pseudo-labels of the photos a trusted class covers.

    python -m benchmarks.review_pool_cost [--photos 2000] [--batch 8] [--from v3000] [--to v4000]

The pool is made of the lab photos (``../shared/data/plantvillage``, 256 px JPEGs like the field's), queued as the
``--from`` engine answered them; the ``--to`` engine (opened as the daemon opens it, ``auto`` precision) then answers
them all again (:class:`edge_agent.review.reanswer.PoolAnswers`), and every class is then trusted for the pseudo-label
pass (:class:`edge_agent.review.trusted_pool.TrustedPool`), so it finds every sure answer: the most it does in one look.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "plantvillage"


def _photos(root: Path, n: int) -> list[Path]:
    """``n`` photos, the classes in turn, in a fixed order."""
    by_class = [sorted(d.glob("*.jpg")) for d in sorted(root.iterdir()) if d.is_dir()]
    out: list[Path] = []
    for i in range(max(len(c) for c in by_class)):
        out += [c[i] for c in by_class if i < len(c)]
    return out[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.review_pool_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=int, default=2000, help="photos in the review pool")
    ap.add_argument("--batch", type=int, default=8, help="photos answered a turn ([pipeline] max_batch)")
    ap.add_argument("--from", dest="old", default="v3000", help="the engine the pool was answered by")
    ap.add_argument("--to", dest="new", default="v4000", help="the engine swapped in")
    ap.add_argument("--data", default=str(SHARED))
    args = ap.parse_args(argv)

    import numpy as np

    from benchmarks.field_loop import _served
    from edge_agent.classifier import Classifier
    from edge_agent.config import LabelsSection, default_store_path, parse_config
    from edge_agent.labelling import LabelQueuer
    from edge_agent.ledger_rows import QueueEntry, ResultRow
    from edge_agent.preprocess import preprocess_bytes
    from edge_agent.results import ResultsDB
    from edge_agent.review.reanswer import PoolAnswers
    from edge_agent.review.trusted_pool import TrustedPool
    from edge_agent.spool import PhotoSpool, SpoolItem
    from engines.store import EngineStore

    cfg = parse_config({})
    store = EngineStore(default_store_path())
    paths = _photos(Path(args.data), args.photos)
    with tempfile.TemporaryDirectory(prefix="edge-pool-") as tmp:
        db, spool = ResultsDB(Path(tmp) / "results.sqlite"), PhotoSpool(Path(tmp) / "queue", 8 << 30)
        old = Classifier.configured(_served(store, cfg, args.old), cfg)
        t = time.perf_counter()
        for i in range(0, len(paths), 64):
            datas = [p.read_bytes() for p in paths[i : i + 64]]
            preds = old.predict_tensors(np.stack([preprocess_bytes(d, old.spec) for d in datas]))
            shas = [hashlib.sha256(d).hexdigest() for d in datas]
            files = spool.put_many([SpoolItem("review", s, d, ".jpg") for s, d in zip(shas, datas)])
            rows = [ResultRow(s, s[:16], str(p), "folder", q.label, q.confidence, [list(k) for k in q.top_k], q.engine_version, {}, verdict=q.verdict)
                    for s, p, q in zip(shas, paths[i : i + 64], preds)]  # fmt: skip
            entries = [QueueEntry(s, s[:16], "review", q.label, q.confidence, q.engine_version, str(f), len(d))
                       for s, q, f, d in zip(shas, preds, files, datas)]  # fmt: skip
            db.commit(rows, entries)
        old.engine.close()
        made = time.perf_counter() - t
        new = Classifier.configured(_served(store, cfg, args.new), cfg)
        answers, turns = PoolAnswers(db, args.batch), []
        t = time.perf_counter()
        while answers.due(new.engine.engine_version):
            t0 = time.perf_counter()
            answers.run(new)
            turns.append(time.perf_counter() - t0)
        again = time.perf_counter() - t
        precision = new.engine.precision
        new.engine.close()
        labels = LabelQueuer(db, spool, LabelsSection(trust_checks=0))
        pool = TrustedPool(db, labels)
        t = time.perf_counter()
        promoted = pool.run(args.new, answered=answers.answered)
        promote = time.perf_counter() - t
        idle = TrustedPool(db, LabelQueuer(db, spool, LabelsSection()))  # (as shipped: the checks' stamp read)
        idle.run(args.new, answered=answers.answered)
        t = time.perf_counter()
        idle.run(args.new, answered=answers.answered)
        idle_look = time.perf_counter() - t
        kept = db._query("SELECT COUNT(*) FROM pool_answers")[0][0]
        db.close()
    turns.sort()
    print(f"a review pool of {len(paths)} lab photos answered by {args.old} (made in {made:.0f} s); {args.new} swapped in ({precision})")
    print("| what | time |")
    print("|---|---|")
    print(
        f"| {answers.answered} photos answered again, {args.batch} a turn | {again:.1f} s ({1000 * again / max(1, answers.answered):.1f} ms a photo) |"
    )
    print(
        f"| one turn (a batch: its decodes and one inference), median / 99th percentile / most | {1000 * turns[len(turns) // 2]:.0f} / {1000 * turns[int(0.99 * (len(turns) - 1))]:.0f} / {1000 * turns[-1]:.0f} ms |"
    )
    print(f"| the pseudo-label pass, every class trusted: {len(promoted)} made | {1000 * promote:.0f} ms |")
    print(f"| the pass again, nothing changed (each idle second, as shipped) | {1000 * idle_look:.2f} ms |")
    print(f"| `pool_answers` rows kept | {kept} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
