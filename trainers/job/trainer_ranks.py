"""The trainer as Ray actors: one per rank, in the placement group's seats, joined into one torch
process group (NCCL on GPUs, gloo on CPUs) through the environment accelerate reads (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each running `training.train_process`.

The job's process watches them. The first rank to fail (an exception, or its process dying)
ends the run: every rank is killed at once (the others would wait in a collective for it) and
with rank 0 go the rollout actors it owns; the error names the rank and its node. A stop asked
of the job (Ctrl-C, `ray job stop`) is passed to every rank, which agree on the step to stop at.
"""

from __future__ import annotations

import os
import sys

from trainers.job.placement import Placement
from trainers.job.seats_on_ray import scheduling
from trainers.job.training import Run, train_process


class TrainerRankFailed(RuntimeError):
    """A trainer rank raised or died; the run was ended (its cause is chained)."""


class TrainerRank:
    """One rank (a plain class; `run_on_ranks` makes it a Ray actor)."""

    def __init__(self, rank: int, world: int) -> None:
        from trainers.job.stopping import GracefulStop

        self.rank, self.world = rank, world
        self.stop = GracefulStop()
        self.console = ConsoleLines()

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port on its node: where the process group meets."""
        import ray

        from rollout.weight_sync.group import free_port

        return ray.util.get_node_ip_address(), free_port()

    def run(self, run: Run, master: tuple[str, int], env: dict[str, str]) -> dict | None:
        os.environ.update(env)
        if self.world > 1:
            os.environ.update(
                RANK=str(self.rank),
                WORLD_SIZE=str(self.world),
                # Ray shows each rank only its own GPU: it is cuda:0 in every rank.
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR=master[0],
                MASTER_PORT=str(master[1]),
            )
        from rollout.process_env import set_process_env_defaults

        set_process_env_defaults()
        if self.rank == 0:  # its step lines go to the job's console (see console_lines)
            sys.stdout = self.console.tee(sys.stdout)
        return train_process(run, self.stop, self.rank, self.world)

    def console_lines(self) -> list[str]:
        """Rank 0's console lines (one per step, the job's notices) printed since the last call:
        Ray does not bring an actor's output to the job's console."""
        return self.console.take()

    def request_stop(self, reason: str) -> None:
        self.stop.request(reason)


def run_on_ranks(
    run: Run,
    group,
    seat_bundles: dict,
    stop,
    env: dict[str, str],
    start_timeout_s: float = 1800.0,
) -> dict:
    """Start every rank in its seat, run the job on them, return rank 0's summary. `stop`: the
    job's GracefulStop, passed on to the ranks once it is asked."""
    import ray

    placement: Placement = run.placement
    world = placement.num_processes
    rank_class = ray.remote(TrainerRank)
    ranks = []
    for seat in placement.ranks:
        ranks.append(
            rank_class.options(
                num_gpus=seat.gpu_share if seat.gpu is not None else 0,
                num_cpus=seat.cpus,
                max_concurrency=3,  # request_stop and console_lines arrive while run() trains
                scheduling_strategy=scheduling(group, seat_bundles[("trainer", seat.index)]),
            ).remote(seat.index, world)
        )
    try:
        try:
            master = ray.get(ranks[0].rendezvous.remote(), timeout=start_timeout_s)
        except Exception as err:  # noqa: BLE001 - named below
            raise TrainerRankFailed(_failure(0, placement, err, "at start")) from _cause(err)
        running = {r.run.remote(run, master, env): i for i, r in enumerate(ranks)}
        summary, told = None, False
        while running:
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            _print_console(ranks[0])
            if stop.requested is not None and not told:
                for r in ranks:
                    r.request_stop.remote(stop.requested)
                told = True
            for ref in done:
                i = running.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as err:  # noqa: BLE001 - the first failure ends the run
                    cause = _cause(err)
                    if _is_users_error(cause):
                        raise cause from None
                    if not _died(err):  # the rank's traceback: its log is not on this console
                        sys.stderr.write(f"{err}\n")
                    raise TrainerRankFailed(_failure(i, placement, err)) from cause
                if i == 0:
                    summary = result
        return summary
    finally:
        # A failed rank leaves the others in a collective; a stopped job, all of them running.
        for r in ranks:
            ray.kill(r, no_restart=True)


class ConsoleLines:
    """The lines of a rank's output that belong on the job's console: its step lines and the
    job's notices ("[step ...", "[train_grpo] ...")."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._partial = ""

    def tee(self, stream):
        console = self

        class Tee:
            def write(self, text: str) -> int:
                console._add(text)
                return stream.write(text)

            def __getattr__(self, name):
                return getattr(stream, name)

        return Tee()

    def _add(self, text: str) -> None:
        self._partial += text
        *whole, self._partial = self._partial.split("\n")
        self._lines += [
            line for line in whole if line.lstrip().startswith(("[step", "[train_grpo]"))
        ]

    def take(self) -> list[str]:
        lines, self._lines = self._lines, []
        return lines


def _print_console(rank) -> None:
    import ray

    try:
        lines = ray.get(rank.console_lines.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - a rank that died is reported by the wait loop
        return
    for line in lines:
        print(line, flush=True)


def _cause(err: BaseException) -> BaseException:
    """The rank's own exception, not Ray's wrapper around it."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


def _died(err: BaseException) -> bool:
    import ray

    return isinstance(err, ray.exceptions.RayActorError)


def _is_users_error(err: BaseException) -> bool:
    """Errors that name the user's own input (a reward function) or a training that diverged
    (weights gone NaN): reported as they are."""
    from trainers.task.reward_loading import RewardFunctionError
    from trainers.trl_adapter.sharded import NonFiniteWeightsError

    return isinstance(err, (RewardFunctionError, NonFiniteWeightsError))


def _failure(rank: int, placement: Placement, err: BaseException, when: str = "") -> str:
    seat = placement.ranks[rank]
    where = f"node {seat.node.address}" + (f" GPU {seat.gpu}" if seat.gpu is not None else "")
    cause = _cause(err)
    died = _died(err)
    what = "died" if died else f"failed{(' ' + when) if when else ''}"
    text = str(cause).strip().splitlines()
    reason = text[-1] if text else type(cause).__name__
    if not died:
        reason = (
            f"{type(cause).__name__}: {reason}" if type(cause).__name__ not in reason else reason
        )
    return f"trainer rank {rank} ({where}) {what}: {reason}; every rank and actor was stopped"
