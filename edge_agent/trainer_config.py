"""The ``[trainer]`` section of the one configuration file, and the options of each training strategy.

The daemon and the trainer read the same file, and the daemon never imports the trainer, so the schema of the
trainer's section lives here, beside the daemon's sections. ``[trainer.strategy]`` is a discriminated union: its
``type`` picks one of the option classes below, each the ``Config`` of the plugin of that name in
:mod:`trainer.strategies` (a test keeps the two lists equal). Why each default is what it is: ``docs/learning-loop.md``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator

from engines.settings import Section

__all__ = [
    "RolloutSection",
    "TrainerSection",
    "StrategyConfig",
    "FinetuneConfig",
    "EwcConfig",
    "RehearsalConfig",
    "LwfConfig",
    "STRATEGY_CONFIGS",
]


class StrategyConfig(Section):
    """Base of every strategy's options; unknown keys are errors."""

    type: str


class FinetuneConfig(StrategyConfig):
    type: Literal["finetune"] = Field("finetune", description="Plain fine-tuning: nothing fights forgetting (the baseline).")


class EwcConfig(StrategyConfig):
    type: Literal["ewc"] = Field("ewc", description="Online Elastic Weight Consolidation: a pull towards earlier solutions.")
    ewc_lambda: float = Field(100.0, ge=0, description="Strength of the pull towards earlier solutions.")
    gamma: float = Field(0.9, ge=0, le=1, description="Share of the earlier Fisher information kept at each generation.")


class RehearsalConfig(StrategyConfig):
    type: Literal["rehearsal"] = Field("rehearsal", description="A class-balanced memory of true labels replayed in every retrain.")
    per_class: int = Field(20, ge=1, description="Photos kept per class in the memory.")
    selection: Literal["random", "herding", "distance"] = Field("herding", description="How the memory's photos are chosen.")


class LwfConfig(StrategyConfig):
    type: Literal["lwf"] = Field("lwf", description="Learning without Forgetting: distil the previous model's outputs.")
    temperature: float = Field(2.0, gt=0, description="Distillation temperature.")
    weight: float = Field(1.0, ge=0, description="Weight of the distillation term in the loss.")


#: Every strategy's options, by type (the plugins in trainer.strategies take theirs from here).
STRATEGY_CONFIGS: dict[str, type[StrategyConfig]] = {
    c.model_fields["type"].default: c for c in (FinetuneConfig, EwcConfig, RehearsalConfig, LwfConfig)
}

Strategy = Annotated[Union[tuple(STRATEGY_CONFIGS.values())], Field(discriminator="type")]


class RolloutSection(Section):
    """``[rollout]``: how the trainer gives a new version to a fleet of devices (tcp:// devices; a daemon on the
    trainer's own state directory takes each version from the shared store at once)."""

    staged: bool = Field(True, description="Give a new version to canary devices first, the rest once they have served it well.")
    canary_share: float = Field(0.1, ge=0, le=1, description="Share of the connected devices that are canaries (at least canary_min).")
    canary_min: int = Field(1, ge=1, description="Fewest canary devices.")
    canaries: list[str] = Field([], description="Device names to use as canaries first (else the first by name).")
    period_s: float = Field(1800.0, ge=0, description="How long every canary must serve the version before the rest receive it.")
    min_photos: int = Field(10, ge=0, description="Photos each canary must classify with the version before the rest receive it.")
    max_errors: int = Field(0, ge=0, description="Inference errors a canary may report on the version before the rollout stops.")
    min_agreement: float = Field(
        0.8, ge=0, le=1, description="Least agreement with the previous version on a canary's golden photos before the rollout stops."
    )


class TrainerSection(Section):
    state_dir: str = Field("", description="Trainer's samples, strategy state and status; empty means <state_dir>/trainer.")
    labelled_data: str = Field(
        "",
        description="Folder of <Class>/<photo> with true labels, replayed in every retrain and split for the gate's "
        "validation set; empty: the replay photos shipped with the default model (see shipped_data), else only expert labels.",
    )
    validation_data: str = Field(
        "",
        description="Folder of <Class>/<photo> held out for the gate only (never trained on), for a model trained on all of "
        "labelled_data; empty: val_fraction of labelled_data, or the gate photos shipped with the default model.",
    )
    shipped_data: bool = Field(
        True,
        description="Where labelled_data / validation_data are empty, use the photos shipped with the default model "
        "(edge_agent/default_data) for the classes the engine in service knows; without validation photos no retrain starts.",
    )
    retrain_threshold: int = Field(200, ge=1, description="Retrain once this many new samples have arrived.")
    expert_threshold: int = Field(
        10, ge=1, description="Retrain once this many new expert labels have arrived, however few samples else (a day's questions)."
    )
    pseudo_per_class: int = Field(
        100,
        ge=0,
        le=1_000_000,
        description="Most pseudo-labels of a class kept and trained on, the newest (older ones are deleted before a retrain, "
        "so a season's disk, memory and retrain time stay bounded; 0: all kept).",
    )
    labels_per_retrain: int = Field(
        500,
        ge=0,
        le=1_000_000,
        description="Most received labels one retrain trains on: every one new since the last retrain, then a class-balanced "
        "draw of the older ones, so a season's retrain time and memory stay bounded (0: all).",
    )
    field_check_every: int = Field(
        4,
        ge=0,
        le=100,
        description="Every Nth expert label of a class is held back, never trained on, to check candidates on this field; "
        "0: none (candidates are then judged on the lab gate photos alone).",
    )
    field_check_min: int = Field(
        6,
        ge=1,
        description="Fewest held-back expert labels the field check judges on; with fewer, once expert labels exist, nothing is published.",
    )
    field_check_judges_on: Literal["all", "new"] = Field(
        "new",
        description="Which held-back photos judge a candidate against the version in service: new, those held back since "
        "it was published once there are field_check_min of them (the photos that chose it flatter it); all, every one.",
    )
    unlabelled_pool: int = Field(
        5000,
        ge=0,
        le=1_000_000,
        description="Most unlabelled photos kept from the devices (the largest device's oldest of its commonest answer leave first; 0: none kept).",
    )
    unlabelled_pool_mb: int = Field(1024, ge=1, description="Most disk the unlabelled photos may take (MiB).")
    unlabelled_term: bool = Field(
        True,
        description="A retrain with expert labels also trains a candidate with the unlabelled photos its first candidate "
        "labels confidently; the field check keeps whichever is better there (doubles the retrain's time).",
    )
    unlabelled_field_min: int = Field(
        12,
        ge=1,
        description="The unlabelled term waits until the field check holds this many photos (on fewer its verdict on the term is a coin toss).",
    )
    unlabelled_min_taken: int = Field(
        16,
        ge=1,
        description="The second candidate is trained only where the term takes at least this many unlabelled photos "
        "(half a training batch; fewer barely change what it learns, and the field check's verdict is then a second draw).",
    )
    unlabelled_epochs: int = Field(
        4,
        ge=0,
        le=500,
        description="The second candidate trains this many epochs on from the first (at the averaging phase's learning "
        "rate, the photos taken at full weight); 0: again from the retrain's start for the full `epochs`.",
    )
    unlabelled_max: int = Field(400, ge=1, le=100000, description="Most unlabelled photos one retrain reads (the newest).")
    unlabelled_precision: float = Field(
        0.95,
        gt=0,
        le=1,
        description="The unlabelled term takes the teacher's answers from the confidence at which it is this often right on the field check.",
    )
    unlabelled_floor: float = Field(
        0.99,
        ge=0,
        le=1,
        description="The unlabelled term never takes an answer less sure than this, nor one its mirror image does not get as surely.",
    )
    unlabelled_method: Literal["self_training", "consistency"] = Field(
        "self_training",
        description="How the unlabelled term learns: `self_training` (the first candidate's sure answers as labels) or "
        "`consistency` (FixMatch: the model's sure answer to a flipped photo is the target for a heavily changed view).",
    )
    consistency_threshold: float = Field(
        0.95, gt=0, le=1, description="The consistency term learns from the pool photos the model answers this sure of, flipped."
    )
    consistency_weight: float = Field(1.0, ge=0, description="The consistency term's weight beside the labelled term.")
    consistency_ratio: int = Field(1, ge=1, le=8, description="Pool photos a consistency step takes per labelled photo.")
    fleet_new_classes: bool = Field(
        False, description="Take expert labels naming a new class from daemons on TCP too, not only from this device's own daemon."
    )
    strategy: Strategy = Field(
        default_factory=RehearsalConfig,
        description="How forgetting is fought: [trainer.strategy] type = "
        + " | ".join(STRATEGY_CONFIGS)
        + ", with that strategy's own options (docs/learning-loop.md).",
    )
    epochs: int = Field(15, ge=1, le=500, description="Epochs per retrain.")
    batch_size: int = Field(32, ge=2, le=1024, description="Training batch size.")
    replay_per_epoch: int = Field(
        0,
        ge=0,
        le=100000,
        description="Labelled photos of each class drawn afresh every epoch from those replayed (a larger replay for the "
        "time of a smaller one); 0: every one, every epoch.",
    )
    micro_batch: int = Field(
        4,
        ge=0,
        le=1024,
        description="Photos the network takes at once in a training step, their gradients summed to batch_size's (the same "
        "step, less memory, where BatchNorm statistics are kept); 0: the whole batch.",
    )
    lr: float = Field(
        0.0,
        ge=0,
        le=1,
        description="AdamW peak learning rate (cosine decay after it) of a retrain with an expert's labels or new classes; "
        "0: the architecture's own (2e-3 for LeafNet, 5e-4 for a pretrained EfficientNet-Lite).",
    )
    pseudo_only_lr: float = Field(
        0.0, ge=0, le=1, description="Learning rate of a retrain on pseudo-labels alone; 0: a quarter of the architecture's lr."
    )
    weight_decay: float = Field(1e-4, ge=0, le=1, description="AdamW weight decay of a retrain.")
    zoom: list[float] = Field(
        default_factory=list,
        description="A retrain's random zoom as [low, high] (above 1 a crop at a random place, below 1 the photo shrunk "
        "amid its reflection); empty: none.",
    )
    swa_epochs: int = Field(
        10,
        ge=0,
        le=500,
        description="Average the weights of the last N epochs of a retrain (SWA, learning rate held at a quarter of lr); "
        "0: the last epoch's weights after a cosine decay to zero.",
    )
    frozen_blocks: int = Field(
        -1,
        ge=-1,
        le=1000,
        description="Leading feature blocks a retrain leaves as they are (less time and memory); -1: the architecture's "
        "own choice (none for LeafNet, the stem and stages 1-4 for EfficientNet-Lite).",
    )
    batchnorm: Literal["auto", "recompute", "keep"] = Field(
        "auto",
        description="A retrain's BatchNorm statistics: recomputed on its training photos, kept as the engine in service has "
        "them, or auto: the architecture's own choice (recompute for LeafNet, keep for EfficientNet-Lite).",
    )
    pseudo_lambda: float = Field(1.0, ge=0, description="Weight of the confidence-weighted pseudo-label loss.")
    expert_weight: float = Field(
        2.0, ge=0, description="Weight of an expert's label in the cross-entropy, relative to a photo of labelled_data (1)."
    )
    ramp_epochs: int = Field(10, ge=0, description="Epochs over which the pseudo-label weight ramps up from ~0 to 1.")
    distill: float = Field(
        1.0,
        ge=0,
        le=100,
        description="Weight of a distillation term from the engine in service on every training batch, beside any "
        "strategy; 0 turns it off.",
    )
    distill_photos: Literal["agreeing", "all"] = Field(
        "agreeing",
        description="Which photos the `distill` term covers: those whose label the engine in service answers (it never "
        "pulls a photo towards the answer its label corrects), or all.",
    )
    distill_temperature: float = Field(2.0, gt=0, description="Temperature of the `distill` term.")
    distill_from: Literal["start", "root"] = Field(
        "start",
        description="Whose answers the `distill` term keeps a candidate close to: the version it starts from, or the "
        "lineage's first version's (the shipped model's lab answers, which would otherwise drift retrain by retrain).",
    )
    start_from: Literal["service", "root"] = Field(
        "service",
        description="Where a retrain with expert labels or new classes starts: the engine in service's weights, or the "
        "lineage's first version's (each candidate learns every label so far afresh, so the lab does not drift retrain by retrain).",
    )
    interpolate: float = Field(
        1.0,
        gt=0,
        le=1,
        description="A retrain with expert labels or new classes keeps the engine in service's weights plus this share of "
        "what it changed (WiSE-FT); 1 keeps the retrained weights.",
    )
    pseudo_only_steps: list[float] = Field(
        [1.0, 0.5, 0.25, 0.125, 0.0],
        min_length=1,
        description="A retrain on pseudo-labels alone keeps the smallest of these steps from the engine in service (0) to "
        "the retrained weights (1) whose log-loss on the gate photos is within one standard error of the lowest; one value "
        "fixes the step.",
    )
    val_fraction: float = Field(0.2, gt=0, lt=1, description="Share of the labelled data held out for the gate (never trained on).")
    gate_tolerance: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Publish only if the candidate's top-1 on the gate photos is at least the current engine's, and the "
        "lineage's first version's, minus this (0.02 = 2 points).",
    )
    lab_drift_max: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Publish only if the candidate's top-1 on the gate photos is at least the lineage's first version's "
        "(the shipped model's) minus the smaller of this and gate_tolerance, however small each generation's own step.",
    )
    lab_steps: list[float] = Field(
        [],
        max_length=8,
        description="Where the lab gate refuses a retrain's candidate, these steps from the engine in service (0) towards "
        "it (1) are tried in turn, the first the lab gate passes going on to the field check; empty: none.",
    )
    gate_max_class_drop: float = Field(0.3, ge=0, le=1, description="Refuse a candidate whose recall of any class drops more than this.")
    threads: int = Field(2, ge=1, le=256, description="CPU threads for training (the daemon keeps the rest).")
    nice: int = Field(
        10, ge=0, le=19, description="Added niceness of the trainer (inference first); above 0 its disk waits for the daemon's too."
    )
    int8: bool = Field(True, description="Also build the INT8 ONNX Runtime variant when publishing.")
    calibrate: bool = Field(
        True,
        description="Fit a softmax temperature on the gate's validation photos and fold it into the published model, so "
        "that a confidence of 0.9 is right about 90 % of the time (pseudo_threshold relies on it).",
    )
    recheck_pseudo: bool = Field(
        True,
        description="Before each retrain, the engine in service looks again at every pseudo-labelled photo and its three "
        "mirror images; a photo whose class does not keep pseudo_threshold in all four waits for a later engine.",
    )
    seed: int = Field(20251120, description="Seed for splits, initialisation and augmentation.")

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy_by_name(cls, value: Any) -> Any:
        """``strategy = "ewc"`` (the form before [trainer.strategy] existed) means that strategy with its defaults."""
        return {"type": value} if isinstance(value, str) else value

    @field_validator("zoom")
    @classmethod
    def _zoom_range(cls, zoom: list[float]) -> list[float]:
        if zoom and not (len(zoom) == 2 and 0.25 <= zoom[0] <= zoom[1] <= 4.0):
            raise ValueError(f"zoom is [low, high] with 0.25 <= low <= high <= 4, or [] for none; got {zoom}")
        return zoom

    @field_validator("pseudo_only_steps", "lab_steps")
    @classmethod
    def _steps_between_0_and_1(cls, steps: list[float]) -> list[float]:
        bad = [a for a in steps if not 0.0 <= a <= 1.0]
        if bad:
            raise ValueError(f"every step must lie between 0 and 1, got {bad}")
        return steps
