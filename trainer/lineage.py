"""A strategy's saved state belongs to one model lineage; a new release starts a new one.

The rehearsal memory stores labels as indices into the class list of the model it was made with, and EWC's anchor
and Fisher information are that model's parameters. When the engine in service descends from another first version
(a package upgrade installed a new release, say the 38-class v1000 over a device's 23-class v0001 -> v0002), the
state is carried over where it keeps its meaning and set aside (kept on disk) where it does not:

- the rehearsal memory's photos are true labels: they are relabelled by class name into the new class list (the
  38 classes extend the 23 by name), and any whose class the new model lacks are dropped; unless the new lineage
  takes other input (another size or normalisation: EfficientNet-Lite's v2000 after LeafNet5's v1000), where the
  stored tensors mean nothing to it and the memory is set aside like any other state (the expert's labels
  themselves are photos in the trainer's sample store, read again by every retrain);
- any other state (EWC's parameters) is moved to ``<strategy>.before-<root>``.

``lineage.json`` beside the strategies records the root and its classes. State from before this file existed is
taken to belong to the newest version outside the current lineage (the device's own last version before the upgrade).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from engines.durable import atomic_write
from engines.store import EngineStore
from trainer.strategies._state_file import load_state, save_state

__all__ = ["adopt_strategy_state", "lineage_root"]


def lineage_root(store: EngineStore, name: str) -> str:
    """The first version of ``name``'s lineage: ``parent`` followed while the store holds it or records it deleted
    (:mod:`engines.prune` never deletes a first version); the oldest one held where the chain leaves the store."""
    held, pruned = set(store.versions()), store.pruned()
    seen, root = set(), name
    while name not in seen:
        seen.add(name)
        parent = (store.read_manifest(name).get("parent") or None) if name in held else pruned.get(name)
        if not parent or (parent not in held and parent not in pruned):
            return root
        name = parent
        root = name if name in held else root
    return root


def _same_input(store: EngineStore, old_root: str | None, root: str) -> bool:
    """Whether two lineages' first versions take the same input and preprocessing (an unknown old root: assumed)."""
    if not old_root or old_root not in store.versions():
        return True
    old, new = store.read_manifest(old_root), store.read_manifest(root)
    return old.get("input") == new.get("input") and old.get("preprocess") == new.get("preprocess")


def adopt_strategy_state(store: EngineStore, root: str, classes: list[str], strategy_dir: Path, log) -> str | None:
    """Make ``strategy_dir``'s state fit the lineage rooted at ``root`` with ``classes``; returns what was done."""
    marker = strategy_dir / "lineage.json"
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded is not None and recorded.get("root") == root:
        return None
    done = None
    states = [p for p in strategy_dir.iterdir() if p.is_dir() and ".before-" not in p.name] if strategy_dir.is_dir() else []
    if states:
        if recorded is not None:
            old_root, old_classes = recorded.get("root"), list(recorded.get("classes", []))
        else:
            others = [v for v in store.versions() if lineage_root(store, v) != root]
            old_root = lineage_root(store, others[-1]) if others else None
            old_classes = store.read_manifest(others[-1])["classes"] if others else []
        kept, dropped = 0, 0
        same_input = _same_input(store, old_root, root)
        for state in states:
            memory = state / "memory.pt"
            blob = load_state(memory) if memory.is_file() and old_classes and same_input else None
            if blob is not None:
                names = [old_classes[int(i)] if int(i) < len(old_classes) else None for i in blob["y"]]
                keep = torch.tensor([n in classes for n in names], dtype=torch.bool)
                y = torch.tensor([classes.index(n) for n in names if n in classes], dtype=torch.long)
                save_state({"x": blob["x"][keep].clone(), "y": y}, memory)
                kept, dropped = kept + int(keep.sum()), dropped + int((~keep).sum())
                continue
            shutil.move(str(state), str(state.with_name(f"{state.name}.before-{old_root or 'upgrade'}")))
        done = (
            f"strategy state of lineage {old_root} adopted for {root}: {kept} rehearsal photos relabelled by class name, {dropped} dropped"
            if same_input
            else f"strategy state of lineage {old_root} set aside for {root}: it takes other input"
        )
        log.warning("strategy_state_adopted", old_root=old_root, root=root, relabelled=kept, dropped=dropped)
    strategy_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(marker, (json.dumps({"root": root, "classes": classes}) + "\n").encode())
    return done
