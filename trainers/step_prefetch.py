"""Build the next optimizer step's micro-batches while the current step trains.

transformers' Trainer gathers every micro-batch of a step before the step's first forward
(`get_batch_samples`), and TRL's streaming trainer builds each one on the host, in Python: pull
samples from the rollout queue, place them in prefix-trie rows, pack, pad, copy to the device.
For the 1.5B GPU recipe that is about 4 s of a 42 s step during which the trainer's GPU waits
(py-spy profile, docs/performance.md). Here one thread builds step N+1's micro-batches during
step N, and the training loop takes them ready-made.

What does not change:
- the samples and their order: one thread pulls from the one iterator, as the loop would;
- the staleness bound: a sample is checked against the weight version its micro-batch will train
  under, not the version current while it is built;
- the metrics: what TRL's batcher and collator record while building a micro-batch is kept with
  it and reaches the trainer's logs with the step that trains it (they never write the trainer's
  metric dict from this thread, so its logging cannot race them);
- errors: a failure while building (a dead rollout worker) is raised in the training loop;
- the run's length: nothing is pulled past the last step's micro-batches.

`perf/rollout_wait_s` then counts what the training loop itself waited for its micro-batches
(rollouts not ready, or building slower than training), not the builder thread's waiting, which
overlaps training.

One training process only: with several, the loader's collectives would run on two threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from typing import Any

logger = logging.getLogger(__name__)

_STEPS_AHEAD = 1  # more would only add staleness: building keeps up with training


class _RolloutWaitAccount:
    """Stands in for TRL's RolloutQueueDataset where the trainer reads and resets `wait_s`."""

    def __init__(self) -> None:
        self.wait_s = 0.0


class NextStepBatches:
    """Replaces a streaming trainer's `get_batch_samples` with one served by a builder thread."""

    def __init__(self, trainer) -> None:
        self._trainer = trainer
        self._original_get_train_dataloader = trainer.get_train_dataloader
        self._sink: defaultdict[str, list] = defaultdict(list)  # written by the builder only
        self._wait = _RolloutWaitAccount()
        self._cond = threading.Condition()
        self._ready: deque[tuple[Any, dict[str, list]]] = deque()
        self._iterator = None
        self._thread: threading.Thread | None = None
        self._requested = 0  # micro-batches the training loop has asked for
        self._produced = 0  # micro-batches built (handed out or ready)
        self._budget: int | None = None  # micro-batches the run will train; None: no end known
        self._ended = False  # the iterator is exhausted
        self._error: BaseException | None = None
        self._stop = False
        self._version_now = 0  # the version the step being served trains under
        self._version_next = 0  # ... and the one after it
        self.enabled = False  # the trainer's loader was found and redirected

    def install(self) -> None:
        """Wrap the trainer's loader construction; prefetching starts once the loader's parts
        were found and redirected (otherwise the trainer keeps its own batching)."""
        self._trainer.get_train_dataloader = self._get_train_dataloader

    # -- set-up, on the training loop's thread
    def _get_train_dataloader(self):
        loader = self._original_get_train_dataloader()
        trainer = self._trainer
        if trainer.accelerator.num_processes != 1:
            logger.info("next-step batch building is off: it needs a single training process")
            return loader
        metrics = trainer._metrics["train"]
        source = getattr(trainer, "_rollout_dataset", None)
        parts = [source, getattr(loader, "dataset", None), getattr(loader, "collate_fn", None)]
        if any(getattr(part, "metrics", None) is not metrics for part in parts):
            logger.warning(
                "next-step batch building is off: this TRL's loader is not laid out as expected "
                "(the trainer builds each step's batches itself)"
            )
            return loader
        for part in parts:
            part.metrics = self._sink
        source.model_version_fn = self._version_for_pull
        trainer._rollout_dataset = self._wait
        trainer.get_batch_samples = self.get_batch_samples
        self.enabled = True
        return loader

    # -- the training loop's side
    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        trainer = self._trainer
        start = time.perf_counter()
        with self._cond:
            self._requested += num_batches
            self._version_now = trainer.model_version
            # TRL bumps the version in on_step_end when the finished step count is a multiple of
            # weight_sync_steps; the next step trains under the bumped one.
            syncs = (trainer.state.global_step + 1) % max(1, trainer.args.weight_sync_steps) == 0
            self._version_next = self._version_now + int(syncs)
            if epoch_iterator is not self._iterator:
                # The first call, or a new epoch (not seen with max_steps and a streaming
                # source): what the old iterator is building still arrives, then the new one's.
                self._iterator, self._ended = epoch_iterator, False
                if self._thread is None:
                    self._start(num_batches)
            self._cond.notify_all()
            while len(self._ready) < num_batches and not (self._ended or self._error):
                self._cond.wait()
            taken = [self._ready.popleft() for _ in range(min(num_batches, len(self._ready)))]
            error = self._error
        if error is not None and len(taken) < num_batches:
            raise RuntimeError("building the training micro-batches failed") from error
        self._wait.wait_s += time.perf_counter() - start
        sink = trainer._metrics["train"]
        for _, metrics in taken:
            for key, values in metrics.items():
                sink[key].extend(values)
        batches = [batch for batch, _ in taken]
        return batches, trainer._get_num_items_in_batch(batches, device)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    # -- the builder thread
    def _start(self, num_batches: int) -> None:
        trainer = self._trainer
        if self._budget is None and trainer.args.max_steps > 0:
            steps_left = trainer.args.max_steps - trainer.state.global_step
            self._budget = max(num_batches, steps_left * trainer.args.gradient_accumulation_steps)
        self._thread = threading.Thread(target=self._build, name="next-step-batches", daemon=True)
        self._thread.start()

    def _wanted(self) -> int:
        """Micro-batches to have built: what was asked for plus one step more, within the run."""
        ahead = self._requested + _STEPS_AHEAD * self._trainer.args.gradient_accumulation_steps
        if self._budget is not None:
            ahead = min(ahead, max(self._budget, self._requested))
        return ahead

    def _version_for_pull(self) -> int:
        """The version the micro-batch being built will train under (read by TRL's staleness
        check, on the builder thread)."""
        return self._version_now if self._produced < self._requested else self._version_next

    def _build(self) -> None:
        while True:
            with self._cond:
                while not self._stop and self._produced >= self._wanted():
                    self._cond.wait()
                if self._stop:
                    self._thread = None
                    return
                iterator = self._iterator
            try:
                batch = next(iterator)
            except StopIteration:
                with self._cond:
                    if iterator is self._iterator:
                        self._ended, self._thread = True, None
                        self._cond.notify_all()
                        return
                continue  # an old epoch's iterator ran out; go on with the new one
            except BaseException as err:  # noqa: BLE001 - raised on the training loop's thread
                with self._cond:
                    self._error, self._thread = err, None
                    self._cond.notify_all()
                return
            metrics = {key: list(values) for key, values in self._sink.items() if values}
            self._sink.clear()
            with self._cond:
                self._ready.append((batch, metrics))
                self._produced += 1
                self._cond.notify_all()
