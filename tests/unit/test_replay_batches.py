"""Routing replay's streaming batches: TRL's planner, with rows keyed on the routes, keeps every
row within its token budget, and the collator lays out each packed position's routes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")

from trl.experimental.async_grpo import async_grpo_trainer as trainer_module  # noqa: E402

from trainers.trl_adapter.replay_batches import (  # noqa: E402
    SAMPLE_ROUTES,
    routed_planner_class,
    routed_tree_row_class,
    routes_collator_class,
)

PROMPT = [1, 2, 3, 4]
ROUTERS, TOP_K = 2, 2


def _sample(completion: list[int], group_id: int, routes: np.ndarray) -> dict:
    """A sample as TRL's queue hands it to the planner, its routes attached."""
    ids = np.array(PROMPT + completion, dtype=np.int64)
    SAMPLE_ROUTES.attach(ids, routes)
    mask = np.array([0] * len(PROMPT) + [1] * len(completion), dtype=np.int64)
    return {
        "input_ids": ids,
        "completion_mask": mask,
        "old_log_probs": np.zeros(len(ids), dtype=np.float32),
        "advantage": 1.0,
        "group_id": group_id,
        "metrics": {},
    }


def _routes(num_tokens: int, differ_at: int | None = None) -> np.ndarray:
    """[num_tokens - 1, ROUTERS, TOP_K] (the last token's routes are never recorded): the same
    experts at every position, or others at `differ_at`."""
    routes = np.zeros((num_tokens - 1, ROUTERS, TOP_K), dtype=np.uint8)
    routes[:, :, 1] = 1
    if differ_at is not None:
        routes[differ_at] = [[2, 3]] * ROUTERS
    return routes


@pytest.fixture
def group_of_two():
    """Two samples of one prompt: TRL shares their first three positions (a node is keyed on its
    token and the next, so the fourth differs); the second routed its second token otherwise in
    the rollout, so only the first position may be shared. 9 tokens folded by TRL, 11 by
    routes."""
    a = _sample([5, 6], group_id=0, routes=_routes(6))
    b = _sample([7, 8], group_id=0, routes=_routes(6, differ_at=1))
    c = _sample([9, 9, 9, 9, 9], group_id=1, routes=_routes(9))  # closes b's micro-batch
    return a, b, c


def test_the_plain_planner_would_overshoot_the_budget_once_refolded(group_of_two) -> None:
    """The case the routed planner exists for: TRL's planner puts both samples in a row of 9
    tokens, which forwards 11 once positions are shared only where routes are."""
    a, b, _ = group_of_two
    rows = next(iter(trainer_module.TokenBudgetBatcher([a, b, _], 1, 9, {})))
    assert len(rows[0].samples) == 2 and len(rows[0].tokens) == 9
    refolded = routed_tree_row_class()()
    for sample in rows[0].samples:
        refolded.add(sample)
    assert len(refolded.tokens) == 11


def test_the_routed_budget_planner_keeps_every_row_within_the_budget(group_of_two) -> None:
    a, b, c = group_of_two
    plain_row = trainer_module.TreeRow
    planner = routed_planner_class(trainer_module.TokenBudgetBatcher)([a, b, c, c], 1, 9, {})
    micro_batches = list(planner)
    # b no longer fits beside a: a row each, then c's
    first_two = [[id(s) for s in rows[0].samples] for rows in micro_batches[:2]]
    assert first_two == [[id(a)], [id(b)]]
    for (row,) in micro_batches:
        assert isinstance(row, routed_tree_row_class()) and len(row.tokens) <= 9
    assert trainer_module.TreeRow is plain_row  # routed rows only while the planner runs


def test_the_routed_count_planner_folds_by_routes(group_of_two) -> None:
    a, b, _ = group_of_two
    (rows,) = list(routed_planner_class(trainer_module.FixedCountBatcher)([a, b], 1, 2))
    assert isinstance(rows[0], routed_tree_row_class())
    assert len(rows[0].samples) == 2 and len(rows[0].tokens) == 11


def test_the_collator_lays_out_routes_and_refuses_plain_rows(group_of_two) -> None:
    a, b, _ = group_of_two
    collator = routes_collator_class()(pad_token_id=0, num_processes=1)
    (rows,) = list(routed_planner_class(trainer_module.FixedCountBatcher)([a, b], 1, 2))
    batch = collator.torch_call([rows])
    routes = batch["routes"].numpy()  # [rows, tokens, ROUTERS, TOP_K]
    assert routes.shape == (1, batch["input_ids"].shape[1], ROUTERS, TOP_K)
    # every position but the two samples' last tokens (no route recorded) has a sample's routes
    ids = batch["input_ids"][0].tolist()
    with_routes = [i for i in range(len(ids)) if (routes[0, i] >= 0).all()]
    assert len(with_routes) == len(ids) - 2
    assert sorted({tuple(routes[0, i].ravel()) for i in with_routes}) == [
        (0, 1, 0, 1),
        (2, 3, 2, 3),
    ]
    plain = trainer_module.TreeRow()
    plain.add(a)
    with pytest.raises(TypeError, match="routed_planner_class"):
        collator.torch_call([[plain]])
