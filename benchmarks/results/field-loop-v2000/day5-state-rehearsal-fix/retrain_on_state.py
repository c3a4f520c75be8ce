"""One retrain of a copy of a field loop run's state (seed 1) with the code as it is now: time and held-out figures.

Usage, from the repository root: ``PYTHONPATH=. python benchmarks/results/field-loop-v2000/day5-state-rehearsal-fix/
retrain_on_state.py RUN/device-fast/seed-1/state OUT.json`` (the state directory of a stopped
``benchmarks.field_loop`` run; it is copied, not changed).
"""

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.field_loop import LoopSettings, _Measure, split_field
from edge_agent.config import parse_config
from edge_agent.log import configure_logging
from engines.store import EngineStore
from trainer.data import recorded_split
from trainer.retrain import retrain
from trainer.samples import SampleStore

configure_logging("info", "console")
src, out_file = Path(sys.argv[1]), Path(sys.argv[2])
with tempfile.TemporaryDirectory(prefix="retrain-on-state-") as tmp:
    state = Path(tmp) / "state"
    shutil.copytree(src, state)
    s = LoopSettings(k=15, budget=90)
    store = EngineStore(state / "engines")
    classes = list(store.open().classes)
    test, _ = split_field(Path(s.data) / s.field, classes, s.seed, s.test_fraction)
    lab = [(x.path, x.label) for x in recorded_split(EngineStore(Path("edge_agent/default_store")).open(), s.lab)["val"]]
    cfg = parse_config({})
    measure = _Measure(cfg, test, lab)
    before = {"engine": store.current(), **measure(store)}
    samples = SampleStore(state / "trainer")
    t0 = time.perf_counter()
    r = retrain(cfg, store, samples, state / "trainer" / "strategy")
    seconds = time.perf_counter() - t0
    after = {"engine": store.current(), **measure(store)}
    samples.close()
unlabelled = {k: v for k, v in (r.metrics.get("unlabelled") or {}).items() if k != "field_most_confident"}
result = {"before": before, "after": after, "published": r.published, "reason": r.reason, "seconds": round(seconds, 1)}
result |= {"memory (this process, measurement included)": r.metrics.get("memory"), "unlabelled": unlabelled}
out_file.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result))
