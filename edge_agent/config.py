"""Typed, validated configuration from one TOML file.

Every option has a default and a description (``edge-agent config show`` prints
them). An unknown key is an error naming the key and the file, and a key an
earlier release took says what replaced it. ``[engine]`` and ``[trainer.strategy]``
are discriminated unions: their ``type`` picks the plugin's own configuration
class (Frigate's detectors work the same way), so each plugin documents and
checks its own options. Components take their section as it is: there is no
second copy of a setting anywhere.

The file is found at ``--config FILE``, else ``$EDGE_AGENT_CONFIG``; with neither,
the defaults apply.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (JetPack 6): the same parser, from PyPI
    import tomli as tomllib

from pydantic import Discriminator, Field, PrivateAttr, Tag, ValidationError, field_validator, model_validator

from edge_agent.alerts.config import AlertsSection, MqttSection, WebhookSection
from edge_agent.imageheader import IMAGE_EXTENSIONS
from edge_agent.trainer_config import STRATEGY_CONFIGS, RolloutSection, TrainerSection
from edge_agent.upgrade import REPLACED_KEYS
from engines.base import backends
from engines.durable import read_at_most
from engines.errors import EdgeAgentError
from engines.settings import Section

__all__ = [
    "AppConfig",
    "ConfigError",
    "load_config",
    "override",
    "parse_config",
    "default_store_path",
    "default_data_path",
    "CONFIG_ENV",
    "SYSTEM_CONFIG",
    "TrainerSection",
]

CONFIG_ENV = "EDGE_AGENT_CONFIG"

#: The largest configuration file read (edge-agent.example.toml, every option with its description, is 25 KB).
MAX_CONFIG_BYTES = 1 << 20

#: The configuration the systemd units read: also what a command reads when given none (where the file exists).
SYSTEM_CONFIG = Path("/etc/edge-agent/edge-agent.toml")


class ConfigError(EdgeAgentError, ValueError):
    """The configuration file is missing, unreadable or invalid; the message names file and key."""


def default_store_path() -> Path:
    """The engine store shipped inside the package (the default model)."""
    return Path(str(resources.files("edge_agent") / "default_store"))


def default_data_path() -> Path:
    """The labelled photos shipped beside the default model: ``gate/`` (the publish gate's) and ``replay/``."""
    return Path(str(resources.files("edge_agent") / "default_data"))


class StoreSection(Section):
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


class PreprocessSection(Section):
    max_file_bytes: int = Field(50 * 1024 * 1024, ge=1024, description="Photos larger than this many bytes are rejected unread.")
    max_pixels: int = Field(
        50_000_000, ge=128 * 128, description="Photos whose header declares more pixels are rejected before decoding (decompression bombs)."
    )


def _dotted_lower(v: list[str]) -> list[str]:
    out = []
    for ext in v:
        if not ext.startswith(".") or len(ext) < 2:
            raise ValueError(f"extension {ext!r} must start with a dot, e.g. '.jpg'")
        out.append(ext.lower())
    return out


class ClassifySection(Section):
    top_k: int = Field(3, ge=1, le=50, description="How many ranked classes each prediction lists.")
    extensions: list[str] = Field(
        list(IMAGE_EXTENSIONS), description="File extensions picked up when a folder is classified (case-insensitive)."
    )
    _ext = field_validator("extensions")(_dotted_lower)
    crops: list[str] = Field(
        [],
        description='The crops grown here, as the class names begin ("Apple", "Corn_(maize)"): answers are chosen '
        "among their classes only; empty: every class the model knows.",
    )
    plant_max_photos: int = Field(
        12,
        ge=0,
        le=10_000,
        description="An inbox subfolder with more photos than this in one visit is not one plant (a synced camera "
        "folder): its photos are judged and alert one by one; 0: no limit.",
    )
    plant_visit_gap_h: float = Field(
        12.0,
        ge=0,
        le=24 * 366,
        description="Photos of one plant taken (EXIF, else classified) more than this many hours apart are separate visits: a plant's diagnosis, "
        "alert and labels take one visit's photos (a tree sick in August is not outvoted by May's); 0: one visit.",
    )

    @property
    def plant_visit_gap_s(self) -> float:
        """``plant_visit_gap_h`` in seconds, as :func:`edge_agent.plants.visits` takes it."""
        return self.plant_visit_gap_h * 3600


class DaemonSection(Section):
    state_dir: str = Field(
        "", description="Where results, queues and processed photos live; empty means $STATE_DIRECTORY, else ./edge-state."
    )
    drain_timeout_s: float = Field(10.0, ge=0, le=600, description="On SIGTERM/SIGINT, how long to finish photos in flight.")
    status_interval_s: float = Field(2.0, gt=0, le=60, description="How often status.json and systemd's STATUS= are refreshed.")
    stall_timeout_s: float = Field(
        30.0, gt=0, description="Photos in flight with no progress for this long make the pipeline unhealthy (no WATCHDOG=1)."
    )


class InboxSection(Section):
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


class CameraSection(Section):
    enabled: bool = Field(False, description="Capture from a camera.")
    source: str = Field(
        "0", description="Device index, /dev/videoN, rtsp:// or http:// (MJPEG) URL, video file, GStreamer pipeline, or 'jetson-csi'."
    )
    interval_s: float = Field(5.0, ge=0, description="Seconds between classified frames (0: every frame).")
    stale_s: float = Field(10.0, gt=0, description="No frame for this long: the stream is stale and is reopened.")
    backoff_initial_s: float = Field(1.0, gt=0, description="First wait before reopening; doubles on each failure.")
    backoff_max_s: float = Field(60.0, gt=0, description="Longest wait between reopen attempts.")
    jpeg_quality: int = Field(95, ge=50, le=100, description="JPEG quality of frames kept for the label queues.")
    place: str = Field(
        "",
        max_length=40,
        description="Where the camera stands, as latitude,longitude in degrees (its frames' place on the Map); empty: not known.",
    )

    @field_validator("place")
    @classmethod
    def _place(cls, value: str) -> str:
        from edge_agent.capture_place import parse_place

        if value.strip():
            parse_place(value)  # ValueError saying why
        return value.strip()


class RetentionSection(Section):
    enabled: bool = Field(True, description="Prune old photos and results, and keep the disk above its floor.")
    photo_days: float = Field(
        30.0, ge=0, le=36500, description="Processed photos (processed/YYYY-MM-DD/) older than this many days are removed; 0: kept."
    )
    result_days: float = Field(
        365.0,
        ge=0,
        le=36500,
        description="Result rows, the page's thumbnails and the records of what the trainer acknowledged older than this many "
        "days are removed; 0: kept.",
    )
    source_result_days: dict[str, float] = Field(
        {}, description="Per source ('inbox', 'camera:<source>'): its result rows' own result_days (a camera's many frames)."
    )
    min_free_gb: float = Field(2.0, ge=0, description="Disk floor: the oldest photos go whenever less than this is free...")
    min_free_percent: float = Field(
        10.0, ge=0, le=90, description="...or less than this share of the disk, whichever is smaller (a big disk is not emptied)."
    )
    interval_s: float = Field(600.0, ge=10, le=86400, description="How often old photos and results are pruned (the floor: every minute).")
    engine_versions: int = Field(
        5,
        ge=0,
        le=100000,
        description="The farm's own retrained engine versions kept on disk, newest first, besides the one in service, the "
        "releases and a rollback's pin (older ones are deleted; 0: all kept).",
    )


class BackupSection(Section):
    dir: str = Field(
        "",
        description="Folder the daemon writes a backup into every every_h hours (a USB stick's or a share's; it must exist); "
        "empty: none, take one with `edge-agent backup`.",
    )
    every_h: float = Field(24.0, ge=1, le=8760, description="Hours between two backups (one taken by hand counts too).")
    keep: int = Field(
        7, ge=1, le=1000, description="This device's newest backups kept in dir; its older ones are deleted, nothing else there."
    )
    photos: bool = Field(False, description="Put the processed photos in each backup too (the history and the labels are in without them).")
    shared_files: bool = Field(
        True,
        description="Keep photos and engines once in dir, in a folder this device's backups share, so each backup writes "
        "only what is new; false: every backup whole in one file.",
    )
    check_every_days: float = Field(
        7.0,
        ge=0,
        le=365,
        description="Days between reading back from dir every photo and engine the newest backup names (a damaged one is "
        "deleted and written again by the next backup); 0: never.",
    )
    passphrase_file: str = Field(
        "",
        description="A file whose first line is the passphrase every backup is sealed with (keep it off the device too: a "
        "restore needs it); empty: backups are not sealed and hold the device's keys as they are.",
    )


class PipelineSection(Section):
    max_batch: int = Field(
        16,
        ge=1,
        le=256,
        description="Most photos per inference batch (fewer engine calls, commits and fsyncs per photo under a burst, more "
        "burst memory); a lone photo waits at most max_wait_ms for company.",
    )
    max_wait_ms: float = Field(20.0, ge=0, le=5000, description="How long a batch waits to fill up.")
    decode_workers: int = Field(2, ge=1, le=32, description="Threads reading and preprocessing photos.")
    queue_size: int = Field(32, ge=1, le=4096, description="Capacity of each queue between stages (back-pressure beyond).")
    idle_trim_s: float = Field(
        1.0, gt=0, le=600, description="Idle this long, the engine hands its cached memory back and the golden photos are saved."
    )


class LabelsSection(Section):
    pseudo_threshold: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The least confidence of a `confident` verdict (which also needs the photo near the training photos); "
        "only confident answers are queued as pseudo-labels.",
    )
    per_class_cap: int = Field(500, ge=0, description="Most pseudo-labels queued per class per engine version.")
    review_threshold: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Below this confidence a photo joins the pool the expert is asked from (ranked by how much its label "
        "would teach, `edge-agent review list`); `unknown` photos, and sure ones too far from the training photos, join "
        "it too. The default takes every photo whose verdict is not `confident`.",
    )
    ask_order: Literal["margin", "draw", "typical"] = Field(
        "margin",
        description="How the photos the model is unsure of are ordered for the expert: `margin` (the least sure first, "
        "spread over the classes the model names), `draw` (a fixed random draw; near-duplicates last in both) or "
        "`typical` (first the photo most typical of each group of like photos no expert label covers yet, the largest "
        "group first; then by margin).",
    )
    reanswer_pool: bool = Field(
        True,
        description="After a swap, answer the review pool's photos again with the engine in service while no photo "
        "waits, so the expert is asked where the model serving now hesitates.",
    )
    reanswer_confidence: float = Field(
        0.0,
        ge=0,
        le=1,
        description="A review-pool photo answered again after a swap becomes a pseudo-label only this sure or surer "
        "(each swap gives it one more chance to cross trust_confidence); 0: the same bar as a new photo.",
    )
    review_per_day: int = Field(
        10,
        ge=0,
        le=10000,
        description="Most photos one expert is asked about per day (local time); `review list` shows the best of the pool up "
        "to what is left of today's budget. 0: no budget.",
    )
    trust_rule: Literal["sequential", "wilson"] = Field(
        "sequential",
        description="How checks earn a class trust: `sequential` (a likelihood-ratio test of trust_precision against "
        "trust_against) or `wilson` (the rule before 2026-11: the precision's Wilson lower end reaches trust_precision).",
    )
    trust_checks: int = Field(
        10,
        ge=0,
        le=1000,
        description="A class's confident answers become pseudo-labels only once the expert has checked at least this many "
        "of them and trust_rule agrees; until then they go to review too. 0 trusts every class from the start.",
    )
    trust_precision: float = Field(
        0.97,
        gt=0,
        lt=1,
        description="The precision of a trusted class's confident answers: what the sequential test expects of it "
        "(the least the Wilson rule accepts, counting one standard error against it).",
    )
    trust_against: float = Field(
        0.85,
        gt=0,
        lt=1,
        description="A class whose confident answers are right this often or less earns trust (sequential rule) with "
        "at most trust_error's chance.",
    )
    trust_error: float = Field(
        0.05, gt=0, lt=0.5, description="The sequential rule's chance of trusting a class that is no better than trust_against."
    )

    @field_validator("trust_against")
    @classmethod
    def _below_precision(cls, v: float, info) -> float:
        wanted = info.data.get("trust_precision")
        if wanted is not None and v >= wanted:
            raise ValueError(f"trust_against ({v}) must be below trust_precision ({wanted}): the test tells the two apart")
        return v

    trust_window: int = Field(
        30, ge=1, le=10000, description="A class's trust is judged on its latest this many checks (older engines' answers fall out)."
    )
    audit_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Of a trusted class's answers trust covers, this share (drawn by photo) still goes to the expert as "
        "checks, so a class whose answers go wrong (a worse engine after a swap) loses its trust; 0: none.",
    )
    trust_confidence: float = Field(
        0.98,
        gt=0,
        le=1,
        description="Trust covers a class's confident answers this sure or surer (pseudo_threshold where that is higher): "
        "only the expert's checks of them count toward it, and only they become pseudo-labels once it is earned "
        "(trust_checks = 0: every confident answer).",
    )

    @property
    def trust_from(self) -> float:
        """The least confidence of an answer trust covers: ``trust_confidence``, or ``pseudo_threshold`` where higher."""
        return max(self.trust_confidence, self.pseudo_threshold)

    @model_validator(mode="after")
    def _window_can_earn_trust(self) -> LabelsSection:
        from edge_agent.review.checks import right_checks_to_trust

        if self.trust_rule != "sequential" or self.trust_checks == 0:
            return self
        needed = right_checks_to_trust(self)
        if self.trust_window < needed:
            raise ValueError(
                f"trust_window ({self.trust_window}) is shorter than the {needed} right checks the sequential test needs "
                f"(trust_precision {self.trust_precision} against trust_against {self.trust_against}, trust_error "
                f"{self.trust_error}): no class could ever earn trust; set trust_window to {needed} or more"
            )
        return self

    review_pool: int = Field(
        2000,
        ge=1,
        description="Most photos kept waiting for review, in at most half of max_spool_mb; beyond either the least informative "
        "(largest margin between the two most probable classes) leave the pool, so new photos and pseudo-labels keep room.",
    )
    max_spool_mb: int = Field(
        2048, ge=1, description="Disk quota for queued photos (MiB). When full: queuing stops, predictions go on, status says so."
    )

    @property
    def review_pool_bytes(self) -> int:
        """The most bytes the review pool's photos may take: half the queue's quota (``max_spool_mb``)."""
        return (self.max_spool_mb << 20) // 2


class HandoffSection(Section):
    enabled: bool = Field(True, description="Deliver queued labels to the trainer over ZeroMQ.")
    unlabelled_per_day: int = Field(
        100,
        ge=0,
        le=100000,
        description="Most review-pool photos a day handed to the trainer without a label, with the model's answer, for "
        "retrains that learn from unlabelled photos (after the labels; 0: none).",
    )
    photo_side: int = Field(
        1024,
        ge=0,
        le=100000,
        description="Photos whose shorter side is larger go to the trainer reduced to this many pixels, upright, as JPEG "
        "without metadata but send_place's EXIF (a 12 MP phone photo about 0.3 MB instead of 2-5 MB), and a trainer keeps any it holds "
        "larger reduced to it; 0: as taken.",
    )
    send_place: bool = Field(
        False,
        description="Hand photos to the trainer with the GPS position, owner's name and serial numbers in their EXIF and XMP "
        "(off: they are blanked, every other byte kept; a photo photo_side reduces keeps its EXIF only when on).",
    )
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
    transfer_endpoint: str = Field(
        "",
        description="Trainer's engine-transfer socket (new engine versions come to the daemon through it, verified and "
        "resumable); empty means ipc://<runtime dir>/transfer.sock. tcp:// uses the same CURVE keys as `endpoint`.",
    )
    name: str = Field("", max_length=64, description="This daemon's name in the trainer's fleet list; empty means the host name.")

    @field_validator("name")
    @classmethod
    def _device_name(cls, value: str) -> str:
        from edge_agent.names import device_name_problem

        if value and (problem := device_name_problem(value)) is not None:
            raise ValueError(problem)
        return value

    transfer_chunk_kb: int = Field(1024, ge=16, le=4096, description="Engine transfer: bytes asked for per request (KiB).")
    transfer_window: int = Field(4, ge=1, le=64, description="Engine transfer: most chunk requests outstanding (flow control).")
    transfer_parallel: int = Field(
        32, ge=1, le=100000, description="Trainer: most devices sent an engine at once (the rest wait their turn; bounds its memory)."
    )


class HotswapSection(Section):
    poll_s: float = Field(5.0, gt=0, description="How often the store's current version is checked (announcements wake it earlier).")
    min_agreement: float = Field(
        0.5,
        ge=0,
        le=1,
        description="A new engine must agree with the running one on this share of recent confident photos, or where it does not, be right on this share of the shipped labelled lab photos.",
    )


class WebSection(Section):
    bind: str = Field(
        "127.0.0.1",
        description="Address `edge-agent web` listens on. Any address other than loopback requires a token "
        "(`edge-agent web --new-token`); 0.0.0.0 opens the page to the farm's network.",
    )
    port: int = Field(8080, ge=1, le=65535, description="Port of the web page.")
    hosts: list[str] = Field(
        [],
        max_length=64,
        description="Other names the page answers to (a DNS name, a reverse proxy's), besides localhost, this machine's name and IP addresses.",
    )
    page_size: int = Field(48, ge=1, le=500, description="Photos per page on the recent-photos page.")
    max_connections: int = Field(
        200, ge=8, le=10000, description="Open connections the page keeps; more are closed at once (a small device stays answering)."
    )
    idle_timeout_s: float = Field(
        10.0, gt=0, le=600, description="A connection that has not sent a whole request in this many seconds is closed."
    )
    class_notes: str = Field(
        "",
        description="A TOML file of the farm's own notes on the classes (its language, its extension service's advice), "
        "read over the shipped ones key by key when `edge-agent web` starts; empty: the shipped notes only.",
    )
    map_image: str = Field(
        "",
        description="An image of the farm from above (a drone photo, a saved satellite view: JPEG, PNG or WebP) drawn "
        "under the Map's dots, placed by map_bounds; empty: no image (the device has no map tiles).",
    )
    map_bounds: list[float] = Field(
        [], description="Where map_image's edges lie, in degrees: [south, west, north, east] (read them off any map app)."
    )

    @model_validator(mode="after")
    def _map_image_placed(self) -> "WebSection":
        b = self.map_bounds
        if self.map_image and len(b) != 4:
            raise ValueError("map_image needs map_bounds = [south, west, north, east] (degrees) to place it")
        if b and (len(b) != 4 or not (-90 <= b[0] < b[2] <= 90 and -180 <= b[1] <= 180 and -180 <= b[3] <= 180 and b[1] != b[3])):
            raise ValueError(
                "map_bounds: [south, west, north, east] in degrees, south below north (latitudes -90..90, longitudes -180..180)"
            )
        return self


class LogSection(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Lowest level logged.")
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="json (for journald), console (readable), or auto: console on a terminal, else json."
    )


def _engine_type(value: Any) -> str | None:
    """The ``type`` an ``[engine]`` table names; onnxruntime when it names none."""
    return value.get("type", "onnxruntime") if isinstance(value, dict) else getattr(value, "type", None)


#: ``[engine]``: the configuration class of the backend its ``type`` names (the registry's list, engines.base).
EngineSection = Annotated[Union[tuple(Annotated[cls.Config, Tag(name)] for name, cls in backends().items())], Discriminator(_engine_type)]


class AppConfig(Section):
    """The whole configuration."""

    engine: EngineSection = Field(
        default_factory=lambda: backends()["onnxruntime"].Config(),
        description="Inference backend; 'type' selects it (" + ", ".join(sorted(backends())) + ") and the other keys are its own.",
    )
    store: StoreSection = Field(default_factory=StoreSection)
    preprocess: PreprocessSection = Field(default_factory=PreprocessSection)
    classify: ClassifySection = Field(default_factory=ClassifySection)
    daemon: DaemonSection = Field(default_factory=DaemonSection)
    inbox: InboxSection = Field(default_factory=InboxSection)
    camera: CameraSection = Field(default_factory=CameraSection)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    retention: RetentionSection = Field(default_factory=RetentionSection)
    backup: BackupSection = Field(default_factory=BackupSection)
    labels: LabelsSection = Field(default_factory=LabelsSection)
    handoff: HandoffSection = Field(default_factory=HandoffSection)
    hotswap: HotswapSection = Field(default_factory=HotswapSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    web: WebSection = Field(default_factory=WebSection)
    alerts: AlertsSection = Field(default_factory=AlertsSection)
    mqtt: MqttSection = Field(default_factory=MqttSection)
    webhooks: list[WebhookSection] = Field([], description="[[webhooks]] tables: URLs that receive alerts as signed POSTs.")
    log: LogSection = Field(default_factory=LogSection)
    _source: str | None = PrivateAttr(None)

    @property
    def source(self) -> str | None:
        """The file this configuration was read from (None: the built-in defaults)."""
        return self._source

    def __eq__(self, other: object) -> bool:
        """Equal settings, wherever they were read from."""
        return type(other) is type(self) and self.__dict__ == other.__dict__

    __hash__ = Section.__hash__


#: Where a discriminated union's tag appears in an error's location: (the key before it, the tags it may be).
_UNIONS = {"engine": ("engine type", lambda: backends()), "strategy": ("strategy", lambda: STRATEGY_CONFIGS)}


def _describe(errors: list[dict], source: str) -> str:
    lines = []
    for err in errors:
        loc = [p for i, p in enumerate(err["loc"]) if not (i and err["loc"][i - 1] in _UNIONS and p in _UNIONS[err["loc"][i - 1]][1]())]
        key = ".".join(str(p) for p in loc)
        if err["type"] == "union_tag_invalid":
            kind, known = _UNIONS[str(loc[-1])]
            lines.append(f"{source}: {key}: unknown {kind} {err['ctx']['tag']!r} (known: {', '.join(sorted(known()))})")
        elif err["type"] == "extra_forbidden":
            why = f" ({REPLACED_KEYS[key]})" if key in REPLACED_KEYS else ""
            lines.append(f"{source}: unknown key '{key}'{why}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {key}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def parse_config(data: dict, source: str = "<config>") -> AppConfig:
    """Validate a parsed TOML document; raises :class:`ConfigError`."""
    try:
        cfg = AppConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc.errors(), source)) from None
    cfg._source = source
    return cfg


def override(cfg: AppConfig, values: dict[str, Any], source: str = "the command line") -> AppConfig:
    """``cfg`` with each dotted key of ``values`` (``"web.port"``) set, None left out, checked as a file's keys are:
    a value out of range raises :class:`ConfigError` naming ``source`` and the key."""
    values = {key: value for key, value in values.items() if value is not None}
    if not values:
        return cfg
    data = cfg.model_dump()
    for key, value in values.items():
        *sections, name = key.split(".")
        node = data
        for section in sections:
            node = node[section]
        node[name] = value
    out = parse_config(data, source)
    out._source = cfg.source
    return out


def load_config(path: str | os.PathLike | None = None) -> AppConfig:
    """Load ``path``, else ``$EDGE_AGENT_CONFIG``, else :data:`SYSTEM_CONFIG` where it exists (what the services
    read); the built-in defaults when there is none of them."""
    path = path or os.environ.get(CONFIG_ENV) or (SYSTEM_CONFIG if SYSTEM_CONFIG.is_file() else None)
    if path is None:
        return AppConfig()
    p = Path(path)
    try:
        raw = read_at_most(p, MAX_CONFIG_BYTES)
        if raw is None:
            raise ConfigError(
                f"{p}: larger than {MAX_CONFIG_BYTES >> 20} MiB, so not a configuration file (edge-agent config show writes one)"
            )
        data = tomllib.loads(raw.decode())
    except FileNotFoundError:
        raise ConfigError(f"{p}: configuration file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory; --config takes a TOML file (edge-agent config show > edge-agent.toml)") from None
    except PermissionError:
        raise ConfigError(f"{p}: not readable by this user") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: nested too deeply") from None
    return parse_config(data, str(p))
