"""Ctrl-C and SIGTERM (`ray job stop`) end a run at the next step boundary, with a checkpoint.

The first signal asks the trainer to save and stop after the step it is in; the job then writes
its summary and tears Ray down as on a normal end. A second signal stops at once (KeyboardInterrupt),
still through the job's clean-up. A step can be long on a GPU recipe: `ray job stop` gives the
driver RAY_JOB_STOP_WAIT_TIME_S seconds before it kills it, so raise that to a step's length.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class GracefulStop:
    def __init__(self) -> None:
        self.requested: str | None = None  # the signal's name, once one arrived

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping now")
        self.requested = signal.Signals(signum).name
        print(
            f"\n[train_grpo] {self.requested}: stopping after this step with a checkpoint "
            "(send it again to stop at once)",
            flush=True,
        )

    @contextmanager
    def installed(self) -> Iterator[GracefulStop]:
        """Handle SIGINT and SIGTERM inside the block (only the main thread may install them)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        before = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)

    def request(self, reason: str) -> None:
        """Ask for the stop from another thread (a trainer rank told by the job's process)."""
        self.requested = self.requested or reason

    def callback(self, save: bool, every_rank: bool = False):
        """A TrainerCallback that ends training (with a checkpoint when `save`) once a signal
        came. `every_rank`: the trainer runs across ranks, which must stop at the same step
        (one rank leaving the loop would hang the others' collectives): at each step's end they
        agree, one small all-reduce, whether any of them was asked."""
        from transformers import TrainerCallback

        stop = self

        class StopOnSignal(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                asked = stop.requested is not None
                if every_rank:
                    asked = _any_rank(asked, args.device)
                if asked:
                    control.should_training_stop = True
                    control.should_save = save
                return control

        return StopOnSignal()


def _any_rank(flag: bool, device) -> bool:
    import torch
    import torch.distributed as dist

    votes = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return bool(votes.item())
