"""The two ways to drive steps. Both call the same scheduler and runner; only the order differs.

- SyncLoop, the reference: schedule, launch, wait, process. The device idles while the host
  schedules and processes.
- OverlapLoop: schedule and launch step N + 1 *before* waiting for step N, so the device always
  has the next step queued. Tokens that step N + 1 needs from step N are placeholders filled on the
  device (carry-over); a sequence that stops at step N may compute one extra token in step N + 1,
  which `Scheduler.process_results` drops. While the engine speculates (few sequences left),
  it runs in the sync order: drafts need the last tokens, and a verification decides how many
  tokens the next step starts from.
"""

from __future__ import annotations

from rollout.engine.execution.model_runner import ModelRunner, StepHandle
from rollout.engine.scheduling.route_traces import record_step_routes
from rollout.engine.scheduling.scheduler import Scheduler
from rollout.engine.scheduling.sequence import Sequence
from rollout.engine.scheduling.step_inputs import build_step_inputs
from rollout.engine.scheduling.step_plan import StepPlan


class _Loop:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, block_size: int) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.block_size = block_size
        self.num_steps = 0

    def _launch(self) -> tuple[StepPlan, StepHandle] | None:
        plan = self.scheduler.schedule()
        if plan is None:
            return None
        self.num_steps += 1
        return plan, self.runner.launch(
            plan.step_id, build_step_inputs(plan, self.block_size, self.scheduler.table_rows)
        )

    def _finish(self, launched: tuple[StepPlan, StepHandle]) -> list[Sequence]:
        plan, handle = launched
        token_ids, logprobs = self.runner.wait(handle)
        routes = self.runner.routes(handle)
        if routes is not None:
            record_step_routes(plan, routes)
        return self.scheduler.process_results(plan, token_ids, logprobs)

    def _stuck(self) -> RuntimeError:
        return RuntimeError(
            "scheduler has unfinished sequences but nothing it can run (this is a bug: "
            f"{len(self.scheduler.waiting)} waiting, {len(self.scheduler.running)} running)"
        )


class SyncLoop(_Loop):
    def step(self) -> list[Sequence]:
        launched = self._launch()
        if launched is None:
            if self.scheduler.has_unfinished():
                raise self._stuck()
            return []
        return self._finish(launched)

    def has_in_flight(self) -> bool:
        return False


class OverlapLoop(_Loop):
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, block_size: int) -> None:
        super().__init__(scheduler, runner, block_size)
        self._in_flight: tuple[StepPlan, StepHandle] | None = None

    def step(self) -> list[Sequence]:
        in_flight = self._in_flight
        if in_flight is not None and (
            in_flight[0].speculative or self.scheduler.wants_speculation()
        ):
            # Drafting needs each sequence's last token on the host, and the step after a
            # verification depends on how many drafts it accepted: finish first (the sync order).
            self._in_flight = None
            finished = self._finish(in_flight)
            self._in_flight = self._launch()
            return finished
        launched = self._launch()  # queued behind the in-flight step on the device
        finished = self._finish(self._in_flight) if self._in_flight is not None else []
        if launched is None and self._in_flight is None and self.scheduler.has_unfinished():
            raise self._stuck()
        self._in_flight = launched
        return finished

    def has_in_flight(self) -> bool:
        return self._in_flight is not None
