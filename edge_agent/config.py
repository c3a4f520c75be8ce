"""Typed, validated configuration from one TOML file.

Every option has a default and a description (``edge-agent config show`` prints
them). An unknown key is an error naming the key and the file. The ``[engine]``
table is validated by the configuration model of the backend its ``type`` names,
so each backend documents and checks its own options.

The file is found at ``--config FILE``, else ``$EDGE_AGENT_CONFIG``; with neither,
the defaults apply.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (JetPack 6): the same parser, from PyPI
    import tomli as tomllib

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edge_agent.imageheader import IMAGE_EXTENSIONS
from engines.base import BackendConfig, backends
from engines.errors import EdgeAgentError

__all__ = ["AppConfig", "ConfigError", "load_config", "dump_toml", "default_store_path", "default_data_path", "CONFIG_ENV"]

CONFIG_ENV = "EDGE_AGENT_CONFIG"


class ConfigError(EdgeAgentError, ValueError):
    """The configuration file is missing, unreadable or invalid; the message names file and key."""


def default_store_path() -> Path:
    """The engine store shipped inside the package (the default model)."""
    return Path(str(resources.files("edge_agent") / "default_store"))


def default_data_path() -> Path:
    """The labelled photos shipped beside the default model: ``gate/`` (the publish gate's) and ``replay/``."""
    return Path(str(resources.files("edge_agent") / "default_data"))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreSection(_Section):
    path: str = Field(
        "",
        description="Engine store directory. Empty: `classify` uses the shipped default model; the daemon and the "
        "trainer share <state_dir>/engines, seeded from it on first start.",
    )
    trusted_keys: list[str] = Field(
        [],
        description="Public keys (64 hex characters, or .pub files) of trainers whose engines this daemon serves, beside "
        "the two it always trusts: the edge-agent project's (it signs the shipped model) and the key of a trainer on the "
        "same state directory (<trainer state>/signing.pub, made on the trainer's first start). A version signed by no "
        "trusted key is refused, from the wire and from disk alike. `edge-trainer signing-key` prints a trainer's key.",
    )
    require_signature: bool = Field(
        True,
        description="Refuse engine versions without a valid signature from a trusted key. false serves unsigned versions "
        "(stores made before signing existed); anyone who can write the store can then choose the model.",
    )

    def resolved(self) -> Path:
        return Path(self.path).expanduser() if self.path else default_store_path()


class PreprocessSection(_Section):
    max_file_bytes: int = Field(
        50 * 1024 * 1024, ge=1024, description="Photos larger than this many bytes are rejected unread."
    )
    max_pixels: int = Field(
        50_000_000,
        ge=128 * 128,
        description="Photos whose header declares more pixels are rejected before decoding (decompression bombs).",
    )


def _dotted_lower(v: list[str]) -> list[str]:
    out = []
    for ext in v:
        if not ext.startswith(".") or len(ext) < 2:
            raise ValueError(f"extension {ext!r} must start with a dot, e.g. '.jpg'")
        out.append(ext.lower())
    return out


class ClassifySection(_Section):
    top_k: int = Field(3, ge=1, le=50, description="How many ranked classes each prediction lists.")
    extensions: list[str] = Field(
        list(IMAGE_EXTENSIONS), description="File extensions picked up when a folder is classified (case-insensitive)."
    )
    _ext = field_validator("extensions")(_dotted_lower)
    crops: list[str] = Field(
        [], description="The crops grown here, as the class names begin (\"Apple\", \"Corn_(maize)\"): answers are chosen "
        "among their classes only; empty: every class the model knows.",
    )


class DaemonSection(_Section):
    state_dir: str = Field(
        "", description="Where results, queues and processed photos live; empty means $STATE_DIRECTORY, else ./edge-state."
    )
    drain_timeout_s: float = Field(10.0, ge=0, le=600, description="On SIGTERM/SIGINT, how long to finish photos in flight.")
    status_interval_s: float = Field(2.0, gt=0, le=60, description="How often status.json and systemd's STATUS= are refreshed.")
    stall_timeout_s: float = Field(
        30.0, gt=0, description="Photos in flight with no progress for this long make the pipeline unhealthy (no WATCHDOG=1)."
    )


class InboxSection(_Section):
    enabled: bool = Field(True, description="Watch the hot folder.")
    path: str = Field("", description="The hot folder; empty means <state_dir>/inbox.")
    after: Literal["move", "delete", "leave"] = Field(
        "move", description="What happens to a photo once its result is stored: move to processed/YYYY-MM-DD/, delete, or leave."
    )
    extensions: list[str] = Field(list(IMAGE_EXTENSIONS), description="Extensions picked up (others are ignored).")
    ignore_suffixes: list[str] = Field(
        [".tmp", ".part", ".partial", ".crdownload", ".swp", "~"],
        description="Names ending so are temporary files and ignored (hidden files always are).",
    )
    recursive: bool = Field(True, description="Watch subfolders too.")
    settle_s: float = Field(1.0, ge=0, le=600, description="A file must keep its size and mtime this long before it is read.")
    incomplete_grace_s: float = Field(
        30.0, ge=0, description="A file that still looks truncated is re-checked until it is this old, then quarantined."
    )
    rescan_interval_s: float = Field(10.0, gt=0, description="Full rescans catch events the OS dropped.")
    _ext = field_validator("extensions")(_dotted_lower)


class CameraSection(_Section):
    enabled: bool = Field(False, description="Capture from a camera.")
    source: str = Field(
        "0",
        description="Device index, /dev/videoN, rtsp:// or http:// (MJPEG) URL, video file, GStreamer pipeline, or 'jetson-csi'.",
    )
    interval_s: float = Field(5.0, ge=0, description="Seconds between classified frames (0: every frame).")
    stale_s: float = Field(10.0, gt=0, description="No frame for this long: the stream is stale and is reopened.")
    backoff_initial_s: float = Field(1.0, gt=0, description="First wait before reopening; doubles on each failure.")
    backoff_max_s: float = Field(60.0, gt=0, description="Longest wait between reopen attempts.")
    jpeg_quality: int = Field(95, ge=50, le=100, description="JPEG quality of frames kept for the label queues.")


class PipelineSection(_Section):
    max_batch: int = Field(
        16,
        ge=1,
        le=256,
        description="Most photos per inference batch. Under a burst, bigger batches mean fewer engine calls, commits and "
        "fsyncs per photo (16 vs 4: +10-15 % end to end on 2 CPU cores); the engine's burst memory (~240 MB peak at 16 "
        "on CPU, ~150 at 4) is handed back once idle. A lone photo waits at most max_wait_ms for company.",
    )
    max_wait_ms: float = Field(20.0, ge=0, le=5000, description="How long a batch waits to fill up.")
    decode_workers: int = Field(2, ge=1, le=32, description="Threads reading and preprocessing photos.")
    queue_size: int = Field(32, ge=1, le=4096, description="Capacity of each queue between stages (back-pressure beyond).")
    idle_trim_s: float = Field(
        1.0, gt=0, le=600, description="Idle this long, the engine hands its cached memory back and the golden photos are saved."
    )


class LabelsSection(_Section):
    pseudo_threshold: float = Field(
        0.9, gt=0, le=1,
        description="The least confidence of a `confident` verdict (which also needs the photo near the training photos); "
        "only confident answers are queued as pseudo-labels.",
    )
    per_class_cap: int = Field(500, ge=0, description="Most pseudo-labels queued per class per engine version.")
    review_threshold: float = Field(
        0.9, ge=0, le=1,
        description="Below this confidence a photo joins the pool the expert is asked from (ranked by how much its label "
        "would teach, `edge-agent review list`); `unknown` photos, and sure ones too far from the training photos, join "
        "it too. The default takes every photo whose verdict is not `confident`.",
    )
    review_per_day: int = Field(
        10, ge=0, le=10000,
        description="Most photos one expert is asked about per day (local time); `review list` shows the best of the pool up "
        "to what is left of today's budget. 0: no budget.",
    )
    review_pool: int = Field(
        2000, ge=1,
        description="Most photos kept waiting for review; beyond it the least informative (largest margin between the two "
        "most probable classes) leave the pool, so it never crowds pseudo-labels out of the disk quota.",
    )
    max_queue_mb: int = Field(
        2048, ge=1, description="Disk quota for queued photos (MiB). When full: queuing stops, predictions go on, status says so."
    )


class HandoffSection(_Section):
    enabled: bool = Field(True, description="Deliver queued labels to the trainer over ZeroMQ.")
    endpoint: str = Field(
        "", description="Trainer's hand-off socket; empty means ipc://<runtime dir>/handoff.sock ($RUNTIME_DIRECTORY or <state>/run)."
    )
    announce_endpoint: str = Field("", description="Trainer's engine announcements (PUB); empty means ipc://<runtime dir>/engines.sock.")
    curve_secret_key: str = Field("", description="tcp:// only: this side's CURVE secret certificate (*.key_secret).")
    curve_server_key: str = Field("", description="tcp:// only, daemon: the trainer's public certificate (*.key).")
    curve_authorized_dir: str = Field("", description="tcp:// only, trainer: folder of the daemons' public certificates it accepts.")
    window: int = Field(16, ge=1, le=1024, description="Most unacknowledged samples in flight.")
    ack_timeout_s: float = Field(5.0, gt=0, description="Resend a sample not acknowledged within this; doubles on each resend.")
    backoff_max_s: float = Field(60.0, gt=0, description="Longest wait between resends.")
    heartbeat_s: float = Field(2.0, gt=0, description="Heartbeat interval; a peer silent for 3 intervals counts as down.")
    max_payload_mb: int = Field(32, ge=1, le=1024, description="Larger frames are dropped, counted and logged.")
    delivery_endpoint: str = Field(
        "",
        description="Trainer's engine-transfer socket (new engine versions come to the daemon through it, verified and "
        "resumable); empty means ipc://<runtime dir>/delivery.sock. tcp:// uses the same CURVE keys as `endpoint`.",
    )
    name: str = Field("", max_length=64, description="This daemon's name in the trainer's fleet list; empty means the host name.")
    transfer_chunk_kb: int = Field(1024, ge=16, le=4096, description="Engine transfer: bytes asked for per request (KiB).")
    transfer_window: int = Field(4, ge=1, le=64, description="Engine transfer: most chunk requests outstanding (flow control).")


class HotswapSection(_Section):
    poll_s: float = Field(5.0, gt=0, description="How often the store's current version is checked (announcements wake it earlier).")
    min_agreement: float = Field(
        0.5, ge=0, le=1, description="A new engine must agree with the running one on this share of recent confident photos."
    )


class TrainerSection(_Section):
    state_dir: str = Field("", description="Trainer's samples, strategy state and status; empty means <state_dir>/trainer.")
    labelled_data: str = Field(
        "",
        description="Folder of <Class>/<photo> with true labels (e.g. the data the shipped model was trained on): "
        "replayed in every retrain and split for the gate's validation set. Empty: the replay photos shipped with the "
        "default model (see shipped_data), else only expert labels serve.",
    )
    validation_data: str = Field(
        "",
        description="Folder of <Class>/<photo> held out for the gate only (never trained on). Set it when the model in "
        "service was trained on all of labelled_data, so the gate does not judge it on photos it has seen; "
        "labelled_data is then replayed whole. Empty: val_fraction of labelled_data is held out, or with no "
        "labelled_data the gate photos shipped with the default model (see shipped_data).",
    )
    shipped_data: bool = Field(
        True,
        description="Where labelled_data / validation_data are empty, use the photos shipped with the default model "
        "(edge_agent/default_data: its 184 test photos for the gate, 8 photos per class to replay), for the classes the "
        "engine in service knows. Without validation photos from somewhere no retrain can be published, so the trainer "
        "then starts none and says so.",
    )
    retrain_threshold: int = Field(200, ge=1, description="Retrain once this many new samples have arrived.")
    fleet_new_classes: bool = Field(
        False, description="Take expert labels naming a new class from daemons on TCP too, not only from this device's own daemon."
    )
    strategy: Literal["finetune", "ewc", "rehearsal", "lwf"] = Field(
        "rehearsal",
        description="How forgetting is fought. rehearsal (a class-balanced memory of true labels replayed in every "
        "retrain) forgot 0.11 of task A in the class-incremental benchmark where finetune, ewc and lwf forgot all of it.",
    )
    epochs: int = Field(15, ge=1, le=500, description="Epochs per retrain.")
    batch_size: int = Field(32, ge=2, le=1024, description="Training batch size.")
    lr: float = Field(
        2e-3, gt=0, le=1,
        description="AdamW peak learning rate for fine-tuning (cosine decay after it), for a retrain with something new "
        "to learn: an expert's labels or new classes (the field simulation's expert arms: +5.3 points at 2e-3; the "
        "device-10 arm on seed 1 gained +7.6 at 2e-3 and +3.3 at 5e-4 with interpolate 0.5). See pseudo_only_lr for the other retrains.",
    )
    pseudo_only_lr: float = Field(
        5e-4, gt=0, le=1,
        description="Learning rate of a retrain on pseudo-labels alone (no expert label, no new class): such labels carry "
        "at most +1.6 points on this data (the measured bound), and out of the box (the shipped model, 300 photos) a "
        "retrain at 2e-3 lost 2.6 +- 0.8 points on unseen photos. The step actually taken is chosen: pseudo_only_steps.",
    )
    swa_epochs: int = Field(
        10, ge=0, le=500,
        description="Average the weights of the last N epochs of a retrain (SWA; the learning rate is held at a quarter "
        "of lr while averaging), like the SWA-trained models it replaces. 0: the last epoch's weights after a cosine "
        "decay to zero.",
    )
    pseudo_lambda: float = Field(1.0, ge=0, description="Weight of the confidence-weighted pseudo-label loss.")
    expert_weight: float = Field(
        2.0, ge=0,
        description="Weight of an expert's label in the cross-entropy, relative to a photo of labelled_data (1): the "
        "expert was asked about exactly the photos the model is unsure of.",
    )
    ramp_epochs: int = Field(10, ge=0, description="Epochs over which the pseudo-label weight ramps up from ~0 to 1.")
    ewc_lambda: float = Field(100.0, ge=0, description="EWC: strength of the pull towards earlier solutions.")
    lwf_temperature: float = Field(2.0, gt=0, description="LwF and `distill`: distillation temperature.")
    distill: float = Field(
        1.0, ge=0, le=100,
        description="Weight of a distillation term from the engine in service (its softened outputs on every training "
        "batch), beside any strategy: it keeps a retrain close to what the model already knew. Out of the box (300 "
        "photos the shipped model knew) the second version scored 0.9511 with it and 0.9293 without, against the "
        "first's 0.9565, on photos neither trained on. 0 turns it off.",
    )
    interpolate: float = Field(
        1.0, gt=0, le=1,
        description="The candidate's weights: the engine in service's plus this share of what the retrain changed "
        "(weight-space ensembling, WiSE-FT), for a retrain with expert labels or new classes. 1 keeps the retrained "
        "weights as they are.",
    )
    pseudo_only_steps: list[float] = Field(
        [1.0, 0.5, 0.25, 0.125, 0.0], min_length=1,
        description="A retrain on pseudo-labels alone tries these points between the engine in service (0) and the "
        "retrained weights (1), each with BatchNorm statistics recomputed on the photos it trained on, and keeps the "
        "smallest whose log-loss on the gate photos is within one standard error of the lowest (a bigger change must be "
        "better by more than the gate photos can measure; 0: the weights stay, only the BatchNorm statistics adapt to the "
        "photos seen). A fixed half-way step lost 1 of 184 unseen photos on every seed out of the box. One value fixes "
        "the step.",
    )

    @field_validator("pseudo_only_steps")
    @classmethod
    def _steps_between_0_and_1(cls, steps: list[float]) -> list[float]:
        bad = [a for a in steps if not 0.0 <= a <= 1.0]
        if bad:
            raise ValueError(f"every step must lie between 0 and 1, got {bad}")
        return steps
    rehearsal_per_class: int = Field(20, ge=1, description="Rehearsal: photos kept per class in the memory.")
    rehearsal_selection: Literal["random", "herding", "distance"] = Field("herding", description="Rehearsal: how the memory is chosen.")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="Share of the labelled data held out for the gate (never trained on).")
    gate_tolerance: float = Field(
        0.02, ge=0, le=1,
        description="Publish only if the candidate's top-1 is at least the current engine's minus this, and at least the "
        "first version's (the root of the lineage: drift cannot add up) minus this (0.02 = 2 points). Two equally good "
        "models differ by 2-4 of the 184 shipped gate photos; a tighter tolerance refuses them at random.",
    )
    gate_max_class_drop: float = Field(0.3, ge=0, le=1, description="Refuse a candidate whose recall of any class drops more than this.")
    threads: int = Field(2, ge=1, le=256, description="CPU threads for training (the daemon keeps the rest).")
    nice: int = Field(10, ge=0, le=19, description="Added niceness of the trainer process (inference first).")
    int8: bool = Field(True, description="Also build the INT8 ONNX Runtime variant when publishing.")
    calibrate: bool = Field(
        True,
        description="Fit a softmax temperature on the gate's validation photos and fold it into the published model, so "
        "that a confidence of 0.9 is right about 90 % of the time (pseudo_threshold relies on it).",
    )
    recheck_pseudo: bool = Field(
        True,
        description="Before each retrain, let the engine in service look again at every pseudo-labelled photo, as it is "
        "and in its three mirror images: train on the class it now gives, where that class keeps a probability of at "
        "least [labels] pseudo_threshold in all four views; hold the photo back otherwise (until a later engine).",
    )
    seed: int = Field(20251120, description="Seed for splits, initialisation and augmentation.")


class WebSection(_Section):
    bind: str = Field(
        "127.0.0.1",
        description="Address `edge-agent web` listens on. Any address other than loopback requires a token "
        "(`edge-agent web --new-token`); 0.0.0.0 opens the page to the farm's network.",
    )
    port: int = Field(8080, ge=1, le=65535, description="Port of the web page.")
    page_size: int = Field(48, ge=1, le=500, description="Photos per page on the recent-photos page.")
    max_connections: int = Field(
        200, ge=8, le=10000, description="Open connections the page keeps; more are closed at once (a small device stays answering)."
    )
    idle_timeout_s: float = Field(
        10.0, gt=0, le=600, description="A connection that has not sent a whole request in this many seconds is closed."
    )


class LogSection(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Lowest level logged.")
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="json (for journald), console (readable), or auto: console on a terminal, else json."
    )


def _default_engine() -> BackendConfig:
    return backends()["onnxruntime"].Config()


class AppConfig(_Section):
    """The whole configuration."""

    engine: BackendConfig = Field(
        default_factory=_default_engine,
        description="Inference backend; 'type' selects it (onnxruntime, tensorrt) and the other keys are its own.",
    )
    store: StoreSection = Field(default_factory=StoreSection)
    preprocess: PreprocessSection = Field(default_factory=PreprocessSection)
    classify: ClassifySection = Field(default_factory=ClassifySection)
    daemon: DaemonSection = Field(default_factory=DaemonSection)
    inbox: InboxSection = Field(default_factory=InboxSection)
    camera: CameraSection = Field(default_factory=CameraSection)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    labels: LabelsSection = Field(default_factory=LabelsSection)
    handoff: HandoffSection = Field(default_factory=HandoffSection)
    hotswap: HotswapSection = Field(default_factory=HotswapSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    web: WebSection = Field(default_factory=WebSection)
    log: LogSection = Field(default_factory=LogSection)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_by_type(cls, value: Any) -> BackendConfig:
        if isinstance(value, BackendConfig):
            return value
        return validate_engine(value)


def validate_engine(table: Any) -> BackendConfig:
    """Validate an ``[engine]`` table with the model of the backend its ``type`` names."""
    if not isinstance(table, dict):
        raise ValueError("must be a table")
    kind = table.get("type", "onnxruntime")
    found = backends()
    if kind not in found:
        raise ValueError(f"unknown engine type {kind!r} (known: {', '.join(sorted(found))})")
    return found[kind].Config.model_validate(table)


#: Keys an earlier release accepted, and what took their place (said with the unknown-key error).
REPLACED_KEYS = {
    "trainer.pseudo_only_interpolate": "replaced by trainer.pseudo_only_steps, the steps a retrain on pseudo-labels "
    "chooses from; pseudo_only_steps = [x] keeps one fixed step",
}


def _describe(errors: list[dict], source: str) -> str:
    lines = []
    for err in errors:
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            why = f" ({REPLACED_KEYS[key]})" if key in REPLACED_KEYS else ""
            lines.append(f"{source}: unknown key '{key}'{why}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {key}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def parse_config(data: dict, source: str = "<config>") -> AppConfig:
    """Validate a parsed TOML document; raises :class:`ConfigError`."""
    data = dict(data)
    engine = data.pop("engine", None)
    errors: list[dict] = []
    try:
        cfg = AppConfig.model_validate(data)
    except ValidationError as exc:
        errors.extend(exc.errors())
        cfg = None
    if engine is not None:
        try:
            engine_cfg = validate_engine(engine)
        except ValidationError as exc:
            errors.extend({**e, "loc": ("engine", *e["loc"])} for e in exc.errors())
        except ValueError as exc:
            errors.append({"type": "value_error", "loc": ("engine", "type"), "msg": str(exc), "input": engine.get("type") if isinstance(engine, dict) else engine})
        else:
            if cfg is not None:
                cfg = cfg.model_copy(update={"engine": engine_cfg})
    if errors:
        raise ConfigError(_describe(errors, source))
    return cfg


def load_config(path: str | os.PathLike | None = None) -> AppConfig:
    """Load ``path`` (or ``$EDGE_AGENT_CONFIG``); defaults when neither is given."""
    path = path or os.environ.get(CONFIG_ENV) or None
    if path is None:
        return AppConfig()
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: configuration file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory; --config takes a TOML file (edge-agent config show > edge-agent.toml)") from None
    except PermissionError:
        raise ConfigError(f"{p}: not readable by this user") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(data, str(p))


# ---- printing -----------------------------------------------------------
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dump_toml(cfg: AppConfig, comments: bool = True) -> str:
    """The configuration as TOML, each key preceded by its description and default."""
    out: list[str] = []
    for name, section in cfg:
        model = type(section)
        if comments and AppConfig.model_fields[name].description:
            out.append(f"# {AppConfig.model_fields[name].description}")
        out.append(f"[{name}]")
        for key, field in model.model_fields.items():
            if comments:
                default = field.get_default(call_default_factory=True)
                out.append(f"# {field.description} Default: {_toml_value(default)}.")
            out.append(f"{key} = {_toml_value(getattr(section, key))}")
        out.append("")
    return "\n".join(out)
