"""Online Elastic Weight Consolidation (Kirkpatrick et al., 2017; Schwarz et al., 2018).

After each accepted generation the diagonal Fisher information is estimated on
that generation's data and folded into a running estimate (decay ``gamma``);
training then pulls parameters towards the previous solution in proportion to
it: ``ewc_lambda / 2 * sum(F * (theta - theta_old)^2)``. Fisher and anchor are
saved under the strategy's state directory, so they survive restarts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edge_agent.trainer_config import EwcConfig
from trainer.photos import INFERENCE_BATCH
from trainer.strategies._state_file import load_state, save_state
from trainer.strategies.base import Generation, Strategy, register


@register
class EWC(Strategy):
    type = "ewc"
    Config = EwcConfig
    config: EwcConfig

    @property
    def _path(self):
        return self.state_dir / "ewc.pt"

    def _load(self) -> tuple[dict, dict]:
        blob = load_state(self._path)
        return ({}, {}) if blob is None else (blob["fisher"], blob["anchor"])

    def before(self, model, previous, data):
        self.fisher, self.anchor = self._load()
        if not self.fisher:  # first generation under EWC: estimate on the data the previous model knew
            self.fisher = fisher_information(previous, data)
            self.anchor = {n: p.detach().clone() for n, p in previous.named_parameters()}
        return data

    def penalty(self, model, x, logits):
        lam = self.config.ewc_lambda
        total = logits.new_zeros(())
        for n, p in model.named_parameters():
            if n in self.fisher and self.fisher[n].shape == p.shape:
                total = total + (self.fisher[n] * (p - self.anchor[n]) ** 2).sum()
        return lam / 2 * total

    def after(self, model, data, features=None):
        gamma = self.config.gamma
        old, _ = self._load()
        new = fisher_information(model, data)
        merged = {n: gamma * old[n] + f if n in old and old[n].shape == f.shape else f for n, f in new.items()}
        anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
        save_state({"fisher": merged, "anchor": anchor}, self._path)


def fisher_information(
    model, data: Generation, batch: int = 32, max_samples: int = 512, part: int = INFERENCE_BATCH
) -> dict[str, torch.Tensor]:
    """Diagonal empirical Fisher: mean squared gradient of the log-likelihood of the given labels, a batch's gradient
    summed over parts of ``part`` photos (the activations of a part held at once, not of the batch)."""
    model.eval()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    fisher = {n: torch.zeros_like(p) for n, p in params.items()}
    n = min(len(data), max_samples)
    for i in range(0, n, batch):
        x, y = data.x[i : min(i + batch, n)], data.y[i : min(i + batch, n)]
        keep = y < model.num_classes
        if not keep.any():
            continue
        model.zero_grad(set_to_none=True)
        x, y = x[keep], y[keep]
        for j in range(0, len(x), part):
            F.nll_loss(F.log_softmax(model(x[j : j + part]), 1), y[j : j + part], reduction="sum").backward()
        for name, p in params.items():
            if p.grad is not None:
                fisher[name] += p.grad.detach() ** 2 / max(int(keep.sum()), 1)
    model.zero_grad(set_to_none=True)
    return {k: v / max(1, -(-n // batch)) for k, v in fisher.items()}
