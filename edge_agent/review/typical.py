"""Which unsure photos stand for the most photos no expert label stands for yet: TypiClust on what the engine returns.

With few labels, a label teaches most where it stands for many photos like it (TypiClust, Hacohen et al. 2022):
the photos are cut into as many clusters as the labels given so far plus the day's questions (k-means); from each
cluster holding no labelled photo, the largest first, the photo most *typical* of it is asked (the least mean
distance to its nearest neighbours in the cluster). As labels cover the clusters, fewer are left uncovered and the
rest of the pool follows in the margin's order (:mod:`edge_agent.review.rank`), which serves better once the
labels are many. What is clustered is the square roots of the verdict's squared distances from a photo to each class
(the model's second output, v3000 on), each row scaled to length one: measured with 30 orchard labels (one
retrain of v4000, five seeds, :mod:`benchmarks.field_ceiling` ``--choose typical-distances``), 3.3 +- 2.9 points
above the margin's order, above it on every seed. Each photo's distances are those of the engine that classified it
(after a retrain, two versions' side by side: scaled to length one, their direction is what is compared).

Pure functions on numpy arrays; the daemon's review queue (``[labels] ask_order = "typical"``) and the benchmarks
share them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

__all__ = ["MAX_CLUSTERS", "ROUND", "kmeans", "rows_of", "typical", "typical_ids"]

#: The most clusters the pool is cut into (a season's thousands of labels would otherwise cut it into thousands,
#: seconds of k-means on a Pi for every look at the queue; with this many labels the margin's order serves better).
MAX_CLUSTERS = 256


def rows_of(distances: np.ndarray) -> np.ndarray:
    """What is clustered of each photo: the square roots of its squared distances to each class, [photos, classes]
    (a distance that is not a finite number, an FP16 engine's overflow, reads as the largest finite one)."""
    d = np.array(distances, np.float64)
    bad = ~np.isfinite(d)
    if bad.any():
        d[bad] = d[~bad].max() if (~bad).any() else 0.0
    return np.sqrt(np.maximum(d, 0.0))


def _sq_distances(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Squared distance of each row of ``x`` to each of ``centres``, [rows, centres] (by the inner products: no rows x
    centres x features array)."""
    return np.maximum((x * x).sum(1)[:, None] - 2.0 * x @ centres.T + (centres * centres).sum(1)[None, :], 0.0)


def kmeans(x: np.ndarray, k: int, seed: int, rounds: int = 50) -> np.ndarray:
    """Cluster of each row of ``x`` (k-means++ start, Lloyd's rounds), as an int array."""
    rng = np.random.default_rng(seed)
    centres = [x[rng.integers(len(x))]]
    nearest = ((x - centres[0]) ** 2).sum(1)
    for _ in range(1, k):
        total = nearest.sum()
        if total <= 0:  # fewer distinct rows than clusters: the rest stay empty
            break
        centres.append(x[rng.choice(len(x), p=nearest / total)])
        nearest = np.minimum(nearest, ((x - centres[-1]) ** 2).sum(1))
    c = np.stack(centres)
    for _ in range(rounds):
        assign = _sq_distances(x, c).argmin(1)
        counts = np.bincount(assign, minlength=len(c))
        sums = np.zeros_like(c)
        np.add.at(sums, assign, x)
        new = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], c)
        if np.allclose(new, c):
            break
        c = new
    return assign


def _spread(x: np.ndarray, members: np.ndarray, neighbours: int, chunk: int = 16) -> np.ndarray:
    """Each member's mean distance to its ``neighbours`` nearest other members (a few rows at a time: no members x
    members x features array)."""
    k = min(neighbours, len(members) - 1)
    if k <= 0:
        return np.zeros(len(members))
    xm = x[members]
    out = []
    for i in range(0, len(members), chunk):
        d = np.sqrt(((xm[i : i + chunk, None, :] - xm[None, :, :]) ** 2).sum(-1))
        out.append(np.sort(d, axis=1)[:, 1 : k + 1].mean(1))
    return np.concatenate(out)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def _picks(x: np.ndarray, assign: np.ndarray, labelled: np.ndarray | None, neighbours: int) -> list[int]:
    """From each cluster of ``assign`` with no ``labelled`` row, the largest first, its most typical row of ``x``."""
    covered = set(assign[labelled].tolist()) if labelled is not None else set()
    picks = []
    for j in np.unique(assign):
        if int(j) in covered:
            continue
        members = np.flatnonzero(assign == j)
        picks.append((-len(members), int(members[int(_spread(x, members, neighbours).argmin())])))
    return [i for _, i in sorted(picks)]


def typical(x: np.ndarray, k: int, seed: int, labelled: np.ndarray | None = None, neighbours: int = 20) -> list[int]:
    """Rows of ``x`` to ask about, best first: ``x`` cut into ``k`` clusters (each row scaled to length one), and from
    each cluster with no ``labelled`` row (a boolean mask; None: none is), the largest first, its most typical row."""
    x = _unit(x)
    if not len(x) or k <= 0:
        return []
    return _picks(x, kmeans(x, min(k, len(x)), seed), labelled, neighbours)


#: The questions a round is taken to ask where the day's budget says nothing (``review_per_day = 0``).
ROUND = 10

#: The last clustering :func:`typical_ids` made: (its photos and cluster count, each photo's cluster). A label
#: changes no photo's distances nor, within a day, the count, so the next look at the queue reuses it.
_last: tuple[tuple, np.ndarray] | None = None


def typical_ids(unsure: list[str], described: list[tuple[str, np.ndarray, bool]], new: int, seed: int = 0) -> list[str]:
    """Of the ``unsure`` photos (their ids), those to ask first, best first: :func:`typical` over what is ``described``
    of them and of the labelled photos ((id, the verdict's squared distances, labelled?) rows: the ledger's
    ``pool_distances``), in as many clusters as labelled photos plus ``new`` questions (0: :data:`ROUND`; at most
    :data:`MAX_CLUSTERS` in all). The photos are clustered in the order of their ids, so that labelling one (it moves
    from the unsure to the labelled) leaves the clusters as they were and covers its own.
    A photo with no distances (an engine whose verdict is not on the features, a photo queued before they were kept)
    or with another engine's classes (rows of another length than most) is not among them."""
    global _last
    asked = set(unsure)
    rows = {sha: d for sha, d, labelled in described if sha in asked and not labelled}
    lengths = Counter(len(d) for d in rows.values())
    if not lengths:
        return []
    width = lengths.most_common(1)[0][0]
    chosen = sorted(((sha, d, lab) for sha, d, lab in described if len(d) == width and (lab or sha in rows)), key=lambda r: r[0])
    labelled = np.array([lab for _, _, lab in chosen])
    k = min(int(labelled.sum()) + (new if new > 0 else ROUND), MAX_CLUSTERS, len(chosen))
    x = _unit(rows_of(np.stack([d for _, d, _ in chosen])))
    key = (tuple(sha for sha, _, _ in chosen), k, seed)
    last = _last
    if last is not None and last[0] == key:
        assign = last[1]
    else:
        assign = kmeans(x, k, seed)
        _last = (key, assign)
    return [chosen[i][0] for i in _picks(x, assign, labelled, 20)]
