"""A trainer whose weights went NaN or infinite syncs nothing (`sharded.refuse_non_finite`): the
actors keep the last weights they received whole, on one rank or across ranks."""

from __future__ import annotations

import datetime
import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from tests.trainer_doubles import OneProcess, RecordingTransfer
from trainers.trl_adapter.sharded import NonFiniteWeightsError, refuse_non_finite, send_to_pool


def _model(poison: float | None = None) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    if poison is not None:
        with torch.no_grad():
            model[1].weight[0, 1] = poison
    return model


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_weight_stops_the_sync_before_the_actors_are_paused(poison) -> None:
    transfer = RecordingTransfer()
    with pytest.raises(NonFiniteWeightsError, match=r"1 tensor\(s\); on this rank: 1.weight"):
        send_to_pool(OneProcess(), _model(poison), transfer, lora=False)
    assert transfer.calls == []


def test_finite_weights_are_sent() -> None:
    transfer = RecordingTransfer()
    send_to_pool(OneProcess(), _model(), transfer, lora=False)
    assert transfer.calls == ["pause", "send 4", "resume"]


def _rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    accelerator = SimpleNamespace(num_processes=2, device=torch.device("cpu"))
    try:
        refuse_non_finite(accelerator, _model(float("nan") if rank == 1 else None))
        results.put((rank, "sent"))
    except NonFiniteWeightsError as err:
        results.put((rank, str(err)))
    finally:
        dist.destroy_process_group()


def test_one_ranks_nan_stops_every_rank() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_rank, args=(r, port, results)) for r in range(2)]
    for p in processes:
        p.start()
    try:
        got = dict(results.get(timeout=90) for _ in processes)
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert "1 tensor(s))" in got[0]  # rank 0's own weights are finite: no names of its own
    assert "1 tensor(s); on this rank: 1.weight" in got[1]


def test_the_new_version_is_counted_before_the_actors_resume(monkeypatch) -> None:
    """Streaming: once the actors resume, groups of the new weights can reach the rollout
    worker at once (the parity probe runs after the resume); the trainer and the worker must
    hold the new version by then, or such a group is scored one version in the future (a
    negative staleness on the console)."""
    from trainers.trl_adapter import sharded

    transfer = RecordingTransfer()
    counted = lambda: transfer.calls.append("counted")  # noqa: E731
    send_to_pool(OneProcess(), _model(), transfer, lora=False, on_sent=counted)
    assert transfer.calls == ["pause", "send 4", "counted", "resume"]

    seen: list[int] = []

    def syncing(accelerator, model, transfer, lora, probe, feed, on_sent):
        on_sent()  # where the real sync calls it: sent, not yet resumed
        seen.append(worker.version)
        return 1.0, 2.0

    worker = SimpleNamespace(version=3)
    worker.update_model_version = lambda v: setattr(worker, "version", v)
    trainer = SimpleNamespace(
        accelerator=OneProcess(), model=_model(), weight_transfer=transfer, lora=False,
        parity=None, feed=None, model_version=3, rollout_worker=worker,
    )  # fmt: skip
    cls = sharded.pool_trainer_class()
    trainer._count_new_version = lambda: cls._count_new_version(trainer)
    monkeypatch.setattr(sharded, "send_to_pool", syncing)
    assert cls._sync_weight_merged(trainer, 0.0) == (1.0, 1.0, 2.0)
    assert seen == [4] and trainer.model_version == 4 and worker.version == 4
