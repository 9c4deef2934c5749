"""Off-policy correction: the rollout's tokens were sampled by the behaviour policy (the actor's
weights, possibly some versions old, in another kernel and dtype), and the loss learns from them
under the trainer's. `trainer.off_policy_correction`:

    none          TRL's loss as it is: PPO's ratio and clip taken against the rollout's logprobs
    token_tis     truncated importance sampling per token: each token's loss weighted by
                  min(pi_trainer / pi_rollout, cap), the ratio then taken against the trainer's
                  own (detached) logprobs
    sequence_mis  masked importance sampling per sequence: a sample whose ratio over all its
                  tokens, exp(sum log pi_trainer - log pi_rollout), lies outside [1/cap, cap] is
                  left out of the loss; the others count with weight 1

Both weights use the trainer's logprobs from the training forward itself (detached), so the
correction costs no extra forward. `log_mismatch` records the per-step figures either way: the
ratio's mean and max, the fraction truncated or masked, and KL(rollout || trainer) estimated on
the rollout's own samples (mean of log pi_rollout - log pi_trainer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainers.trl_adapter import across_ranks

if TYPE_CHECKING:
    import torch


def correction_weights(
    trainer_logps: torch.Tensor,
    rollout_logps: torch.Tensor,
    segment_id: torch.Tensor,
    mode: str,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weights (no gradient) for the flat tokens of one forward, each belonging to
    sample `segment_id`; and the step's mismatch figures over every rank's tokens (each rank
    calls this once a forward, as it runs the forward itself)."""
    import torch

    with torch.no_grad():
        log_ratio = trainer_logps.detach().float() - rollout_logps.float()
        ratio = torch.exp(log_ratio)
        outside_count = torch.zeros((), device=ratio.device)
        num_samples = 0
        if mode == "none":
            weights = torch.ones_like(ratio)
        elif mode == "token_tis":
            weights = ratio.clamp(max=cap)
        elif mode == "sequence_mis":
            num_samples = int(segment_id.max()) + 1 if segment_id.numel() else 0
            per_sample = torch.zeros(num_samples, device=ratio.device)
            per_sample.index_add_(0, segment_id, log_ratio)
            outside = per_sample.abs() > torch.log(torch.tensor(cap))
            weights = (~outside[segment_id]).float()
            outside_count = outside.sum()
        else:
            raise ValueError(f"unknown off-policy correction {mode!r}")
        # Sums, so that the ranks' figures add up to those of one process over all their tokens.
        totals = torch.stack(
            [
                torch.tensor(float(ratio.numel()), device=ratio.device),
                ratio.sum(),
                (-log_ratio).sum(),
                (ratio > cap).sum().float(),
                outside_count.float(),
                torch.tensor(float(num_samples), device=ratio.device),
            ]
        ).double()
        # float64 on every rank, with tokens or without: the ranks reduce the same dtype.
        peak = torch.zeros(1, dtype=torch.float64, device=ratio.device)
        if ratio.numel():
            peak[0] = ratio.max()
        totals, peak = across_ranks.summed(totals), across_ranks.largest(peak)
    return weights, _figures(totals.tolist(), float(peak), mode)


def _figures(totals: list[float], peak: float, mode: str) -> dict[str, float]:
    tokens, ratio_sum, neg_log_ratio_sum, truncated, masked, samples = totals
    stats = {
        "ratio_mean": ratio_sum / tokens if tokens else 1.0,
        "ratio_max": peak if tokens else 1.0,
        "kl": neg_log_ratio_sum / tokens if tokens else 0.0,
    }
    if mode == "token_tis":
        stats["truncated_fraction"] = truncated / tokens if tokens else 0.0
    elif mode == "sequence_mis":
        stats["masked_fraction"] = masked / samples if samples else 0.0
    return stats


class RecordsMismatch:
    """Mixin for both modes' TRL trainers: the correction's setting and its per-step figures,
    and with routing replay (routing_replay.RouteReplay, set by the builder) its figures."""

    off_policy = ("none", 2.0)  # trainer.off_policy_correction and its cap, set by the builder
    route_replay = None

    def record_mismatch(self, stats: dict) -> None:
        for key, value in stats.items():
            self._metrics["train"][f"off_policy/{key}"].append(value)

    def record_routing(self) -> None:
        if self.route_replay is not None:
            for key, value in self.route_replay.take_counts().items():
                self._metrics["train"][key].append(value)


class CorrectedForward:
    """Stands in for the model in AsyncGRPOTrainer.compute_loss: runs it, then rewrites the
    selected tokens' logprobs so that TRL's own PPO loss becomes the corrected one.

    TRL computes -min(r A, clip(r) A) with r = exp(logp - old). Each selected token's logprob is
    replaced by w * (logp - logp.detach()) + old: in value r = 1 (inside the clip), in gradient
    w * d logp, so the loss's gradient is -w A d logp, the corrected policy gradient with the
    ratio taken against the trainer's own policy."""

    def __init__(
        self, model, inputs: dict, mode: str, cap: float, record, extra: dict | None = None
    ) -> None:
        self.model = model
        self.extra = extra or {}  # more keyword arguments for the forward (replayed routes)
        selected = inputs["token_index"] >= 0
        self.token_index = inputs["token_index"][selected]
        self.rollout_logps = inputs["old_log_probs"][selected]
        self.segment_id = inputs["segment_id"][selected]
        self.mode = mode
        self.cap = cap
        self.record = record

    def __call__(self, *args, **kwargs):
        outputs = self.model(*args, **kwargs, **self.extra)
        flat = outputs.log_probs.flatten()
        logps = flat[self.token_index]
        weights, stats = correction_weights(
            logps, self.rollout_logps, self.segment_id, self.mode, self.cap
        )
        self.record(stats)
        if self.mode == "none":
            return outputs
        rewritten = weights * (logps - logps.detach()) + self.rollout_logps.to(logps.dtype)
        flat = flat.index_put((self.token_index,), rewritten)
        outputs.log_probs = flat.view_as(outputs.log_probs)
        return outputs


def padded_weights(
    trainer_logps: torch.Tensor,
    rollout_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`correction_weights` in trl.GRPOTrainer's padded layout ([samples, tokens], `mask` on
    the completion tokens; 1 elsewhere)."""
    import torch

    rows, cols = mask.shape
    segment = torch.arange(rows, device=mask.device)[:, None].expand(rows, cols)
    keep = mask.bool()
    weights, stats = correction_weights(
        trainer_logps[keep], rollout_logps[keep], segment[keep], mode, cap
    )
    full = torch.ones_like(trainer_logps, dtype=torch.float32)
    full[keep] = weights
    return full, stats


def weighted_advantages(trainer, compute_loss, model, inputs: dict, mode: str, cap: float, record):
    """trl.GRPOTrainer's `_compute_loss` with the correction: its per-token logprobs come first,
    then it reads `advantages`; scaling each token's advantage by its weight (>= 0) scales that
    token's clipped loss by it. `inputs` is copied: TRL may reuse the batch."""
    rollout_logps = inputs.get("sampling_per_token_logps")
    if rollout_logps is None:
        return compute_loss(model, inputs)
    inputs = dict(inputs)
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    original = trainer._get_per_token_logps_and_entropies

    def logps_then_weights(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        weights, stats = padded_weights(logps, rollout_logps, mask, mode, cap)
        record(stats)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        inputs["advantages"] = advantages * weights.to(advantages.dtype)
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = logps_then_weights
    try:
        return compute_loss(model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies  # the class's method again
