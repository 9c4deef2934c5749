"""A step's logged figures over every trainer rank (trainers/trl_adapter/across_ranks.py): the
off-policy mismatch and the routing replay's flipped routes, on two gloo ranks each holding part
of the step's tokens, equal one process's over all of them."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch

from trainers.trl_adapter.off_policy import correction_weights
from trainers.trl_adapter.routing_replay import RouteReplay

TRAINER = torch.log(torch.tensor([0.5, 0.5, 0.9, 0.2, 0.2, 0.6, 0.1]))
ROLLOUT = torch.log(torch.tensor([0.5, 0.1, 0.3, 0.2, 0.25, 0.6, 0.4]))
SEGMENT = torch.tensor([0, 0, 1, 2, 2, 3, 3])
HALVES = [
    (TRAINER[:3], ROLLOUT[:3], SEGMENT[:3]),
    (TRAINER[3:], ROLLOUT[3:], SEGMENT[3:] - 2),
]
# (replayed, flipped) routes per rank at two calls; at the second rank 1 replayed nothing.
ROUTE_COUNTS = [[torch.tensor([10, 1]), torch.tensor([4, 2])], [torch.tensor([30, 9]), None]]


def _replay_with(counts) -> RouteReplay:
    """A RouteReplay holding `counts` (its routers stand in: only their device is read)."""
    replay = RouteReplay.__new__(RouteReplay)
    replay.routers = [SimpleNamespace(weight=torch.zeros(1))]
    replay.counts = counts
    return replay


def _on_rank(rank: int, init_file: str, results) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        for mode in ("token_tis", "sequence_mis"):
            _, stats = correction_weights(*HALVES[rank], mode, cap=2.0)
            results.put((rank, mode, stats))
        # A forward in which rank 1 trains no token: its figures still join rank 0's.
        empty = (TRAINER[:0], ROLLOUT[:0], SEGMENT[:0])
        _, stats = correction_weights(*(HALVES[0] if rank == 0 else empty), "token_tis", cap=2.0)
        results.put((rank, "one rank empty", stats))
        for call, counts in enumerate(ROUTE_COUNTS[rank]):
            results.put((rank, f"routing {call}", _replay_with(counts).take_counts()))
    finally:
        dist.destroy_process_group()


def test_two_ranks_log_the_figures_of_all_their_tokens(tmp_path) -> None:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    ranks = [
        context.Process(target=_on_rank, args=(r, str(tmp_path / "init"), results))
        for r in range(2)
    ]
    try:
        for process in ranks:
            process.start()
        seen = [results.get(timeout=120) for _ in range(10)]
        for process in ranks:
            process.join(timeout=30)
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in ranks] == [0, 0]
    for mode in ("token_tis", "sequence_mis"):
        _, whole = correction_weights(TRAINER, ROLLOUT, SEGMENT, mode, cap=2.0)
        per_rank = {rank: stats for rank, m, stats in seen if m == mode}
        assert per_rank[0] == pytest.approx(whole) and per_rank[1] == pytest.approx(whole)
        _, rank_0_alone = correction_weights(*HALVES[0], mode, cap=2.0)
        assert rank_0_alone != pytest.approx(whole), "the test's halves must differ"
    _, rank_0_alone = correction_weights(*HALVES[0], "token_tis", cap=2.0)
    for rank, m, stats in seen:
        if m == "one rank empty":
            assert stats == pytest.approx(rank_0_alone), rank
    routing = {(rank, m): stats for rank, m, stats in seen if m.startswith("routing")}
    for rank in (0, 1):
        assert routing[rank, "routing 0"] == {"routing/flipped_fraction": 10 / 40}
        assert routing[rank, "routing 1"] == {"routing/flipped_fraction": 2 / 4}
    assert _replay_with(None).take_counts() == {}, "one process, nothing replayed"
