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

    def callback(self, save: bool):
        """A TrainerCallback that ends training (with a checkpoint when `save`) once a signal
        came."""
        from transformers import TrainerCallback

        stop = self

        class StopOnSignal(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if stop.requested is not None:
                    control.should_training_stop = True
                    control.should_save = save
                return control

        return StopOnSignal()
