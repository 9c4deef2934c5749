"""The off-policy correction's weights, and that TRL's own losses become the corrected ones: the
streaming trainer's through the rewritten logprobs, the sync trainer's through per-token
advantages."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainers.trl_adapter.off_policy import (
    CorrectedForward,
    correction_weights,
    padded_weights,
    weighted_advantages,
)


def test_token_tis_truncates_and_sequence_mis_masks_whole_samples() -> None:
    trainer = torch.log(torch.tensor([0.5, 0.5, 0.9, 0.2, 0.2]))
    rollout = torch.log(torch.tensor([0.5, 0.1, 0.3, 0.2, 0.25]))  # ratios 1, 5, 3, 1, 0.8
    segment = torch.tensor([0, 0, 1, 2, 2])
    weights, stats = correction_weights(trainer, rollout, segment, "token_tis", cap=2.0)
    assert weights.tolist() == pytest.approx([1.0, 2.0, 2.0, 1.0, 0.8])
    assert stats["truncated_fraction"] == pytest.approx(0.4)
    assert stats["ratio_max"] == pytest.approx(5.0) and stats["ratio_mean"] == pytest.approx(2.16)
    assert stats["kl"] == pytest.approx(float((rollout - trainer).mean()))
    # Per sample: 1 * 5 = 5 (out), 3 (out), 1 * 0.8 = 0.8 (in [1/cap, cap]).
    weights, stats = correction_weights(trainer, rollout, segment, "sequence_mis", cap=2.0)
    assert weights.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert stats["masked_fraction"] == pytest.approx(2 / 3)
    weights, _ = correction_weights(trainer, rollout, segment, "none", cap=2.0)
    assert weights.tolist() == [1.0] * 5


def _trl_streaming_loss(model, inputs, eps: float = 0.2) -> torch.Tensor:
    """AsyncGRPOTrainer.compute_loss's policy loss, as TRL writes it."""
    selected = inputs["token_index"] >= 0
    token_index = inputs["token_index"][selected]
    old = inputs["old_log_probs"][selected]
    advantages = inputs["advantages"][selected]
    log_probs = model().log_probs.flatten()[token_index]
    coef_1 = torch.exp(log_probs - old)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
    return -torch.min(coef_1 * advantages, coef_2 * advantages).sum()


@pytest.mark.parametrize("mode", ["token_tis", "sequence_mis"])
def test_the_streaming_loss_becomes_the_corrected_policy_gradient(mode: str) -> None:
    logits = torch.nn.Parameter(torch.tensor([0.3, -1.2, 0.8, 0.1, -0.4, 2.0]))

    def model():  # one packed row: 6 positions, the last not trained
        return SimpleNamespace(log_probs=torch.nn.functional.logsigmoid(logits)[None])

    rollout = torch.tensor([-0.9, -0.2, -0.5, -0.8, -0.1, 0.0])
    inputs = {
        "token_index": torch.tensor([0, 1, 2, 3, 4, -1]),
        "old_log_probs": rollout,
        "advantages": torch.tensor([1.0, 1.0, -0.5, -0.5, 2.0, 0.0]),
        "segment_id": torch.tensor([0, 0, 1, 1, 2, 0]),
    }
    seen = []
    loss = _trl_streaming_loss(CorrectedForward(model, inputs, mode, 2.0, seen.append), inputs)
    loss.backward()
    lp = torch.nn.functional.logsigmoid(logits.detach())[:5]
    weights, _ = correction_weights(lp, rollout[:5], inputs["segment_id"][:5], mode, 2.0)
    assert weights.min() < 1 or weights.max() > 1 or mode == "sequence_mis"
    # -sum_t w_t A_t d logp_t: the ratio taken against the trainer's own logprobs (value 1).
    reference = torch.nn.Parameter(logits.detach().clone())
    logp = torch.nn.functional.logsigmoid(reference)[:5]
    (-(weights * inputs["advantages"][:5] * logp).sum()).backward()
    torch.testing.assert_close(logits.grad, reference.grad)
    assert loss.item() == pytest.approx(-float(inputs["advantages"][:5].sum()))
    assert len(seen) == 1 and "kl" in seen[0]


def test_none_leaves_trls_streaming_loss_as_it_is() -> None:
    logits = torch.nn.Parameter(torch.tensor([0.3, -1.2]))

    def model():
        return SimpleNamespace(log_probs=torch.nn.functional.logsigmoid(logits)[None])

    inputs = {
        "token_index": torch.tensor([0, 1]),
        "old_log_probs": torch.tensor([-0.9, -0.2]),
        "advantages": torch.tensor([1.0, -1.0]),
        "segment_id": torch.tensor([0, 0]),
    }
    seen = []
    plain = _trl_streaming_loss(model, inputs)
    wrapped = _trl_streaming_loss(CorrectedForward(model, inputs, "none", 2.0, seen.append), inputs)
    assert wrapped.item() == plain.item() and seen[0]["ratio_max"] > 1


def test_the_sync_loss_gets_per_token_advantages_and_the_batch_is_left_alone() -> None:
    trainer_logps = torch.log(torch.tensor([[0.5, 0.9, 0.1], [0.2, 0.2, 0.3]]))
    rollout_logps = torch.log(torch.tensor([[0.5, 0.3, 0.7], [0.2, 0.4, 0.9]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])

    class Trainer:
        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            return trainer_logps, None, None

    def compute_loss(model, inputs):  # the order trl.GRPOTrainer._compute_loss reads them in
        trainer._get_per_token_logps_and_entropies()
        return inputs["advantages"]

    trainer = Trainer()
    batch = {
        "advantages": torch.tensor([1.0, -2.0]),
        "sampling_per_token_logps": rollout_logps,
        "completion_mask": mask,
    }
    seen = []
    advantages = weighted_advantages(
        trainer, compute_loss, None, batch, "token_tis", 2.0, seen.append
    )
    weights, _ = padded_weights(trainer_logps, rollout_logps, mask, "token_tis", 2.0)
    assert weights[0].tolist() == pytest.approx([1.0, 2.0, 1.0]), "masked tokens keep weight 1"
    torch.testing.assert_close(advantages, torch.tensor([[1.0], [-2.0]]) * weights)
    assert batch["advantages"].tolist() == [1.0, -2.0], "TRL may reuse its batch"
    assert "_get_per_token_logps_and_entropies" not in vars(trainer), "the method is restored"
    assert seen and seen[0]["truncated_fraction"] == pytest.approx(1 / 5)
