"""Plain fine-tuning: no protection against forgetting (the baseline)."""

from __future__ import annotations

from edge_agent.trainer_config import FinetuneConfig
from trainer.strategies.base import Strategy, register


@register
class FineTune(Strategy):
    type = "finetune"
    Config = FinetuneConfig
