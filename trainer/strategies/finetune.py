"""Plain fine-tuning: no protection against forgetting (the baseline)."""

from __future__ import annotations

from trainer.strategies.base import Strategy, register


@register
class FineTune(Strategy):
    name = "finetune"
