"""The rollout's routes laid out like each TRL trainer's batch, for `routing_replay.RouteReplay`.

Both trainers forward a batch laid out their own way, so each sample's routes
([prompt + completion - 1, num_routers, top_k], recorded) are put, in `trainer_routes` form, where its tokens
are:

- streaming (AsyncGRPOTrainer): samples are folded into a prefix trie per row, a shared prefix
  forwarded once. Two samples that agree on a token's prefix may still have routed it
  differently in the rollout (each computed it in its own batch position, and near ties go
  either way), so the planner's rows key every node on the routes too (`RoutedTreeRow`, put in
  place by `routed_planner_class`): a position is shared only where its routes are too, and the
  planner's token budget counts the positions so forwarded. A sample's tokens are
  then the root-to-leaf path through the trie that ends at its last trained token's position
  (`tree_kv_index` lists each segment's path in order, one entry per depth), and the collator
  adds the `routes` [rows, tokens, num_routers, top_k] of every packed position. The routes
  travel beside the samples: TRL's queue rebuilds each sample as a dict of its own keys, so they
  are found by the sample's `input_ids` array (`SAMPLE_ROUTES`).
- sync (trl.GRPOTrainer): left-padded prompts then right-padded completions, found by their
  tokens (`RoutesByTokens`, filled by the rollout function).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from functools import cache

import numpy as np
import torch

from trainers.trl_adapter.routing_replay import ROUTES_KWARG, trainer_routes


class RoutesBySample:
    """Each streamed sample's routes, found by the identity of its `input_ids` array (kept only
    while that array lives, so a dropped sample leaves nothing behind)."""

    def __init__(self) -> None:
        self._routes: dict[int, np.ndarray] = {}

    def attach(self, input_ids: np.ndarray, routes: np.ndarray) -> None:
        key = id(input_ids)
        self._routes[key] = routes
        weakref.finalize(input_ids, self._routes.pop, key, None)

    def find(self, input_ids: np.ndarray) -> np.ndarray:
        routes = self._routes.get(id(input_ids))
        if routes is None:
            raise RuntimeError(
                "routing replay: a rollout sample reached the trainer without its routes (the "
                "actors must record them: the job turns rollout.engine.record_routes on)"
            )
        return routes

    def __len__(self) -> int:
        return len(self._routes)


SAMPLE_ROUTES = RoutesBySample()


def packed_routes(rows: list, batch: dict) -> torch.Tensor:
    """[rows, tokens, num_routers, top_k] int32 for a collated AsyncGRPO batch (-1: no route)."""
    samples = [[SAMPLE_ROUTES.find(s["input_ids"]) for s in row.samples] for row in rows]
    route_shape = next(r.shape[1:] for row in samples for r in row)
    out = np.full((*batch["input_ids"].shape, *route_shape), -1, dtype=np.int32)
    for r, row_routes in enumerate(samples):
        token_index = batch["token_index"][r].numpy()
        segment_id = batch["segment_id"][r].numpy()
        trained = token_index >= 0
        token_index, segment_id = token_index[trained], segment_id[trained]
        cu_q = batch["tree_cu_seqlens_q"][r].numpy()
        cu_k = batch["tree_cu_seqlens_k"][r].numpy()
        kv_index = batch["tree_kv_index"][r].numpy()
        positions = batch["position_ids"][r].numpy()
        for i, routes in enumerate(row_routes):
            terms = token_index[segment_id == i]
            if len(terms) == 0:
                continue
            last = int(terms.max())  # the deepest position the sample's loss reads
            segment = int(np.searchsorted(cu_q[cu_q >= 0], last, side="right")) - 1
            path = kv_index[cu_k[segment] : cu_k[segment + 1]]
            depth = int(positions[last])
            assert path[depth] == last, "the trie path of a sample must pass its positions"
            n = min(depth + 1, len(routes))
            out[r, path[:n]] = trainer_routes(routes[:n])
    return torch.from_numpy(out)


@cache
def routed_tree_row_class():
    """TRL's TreeRow whose nodes are keyed on (token, next token, the token's routes): samples
    share a position only where the rollout routed it the same way. `fits` walks the same keys
    as `add`, so the planner's budget bounds the tokens the row forwards."""
    from trl.experimental.async_grpo.packing import TreeRow

    class RoutedTreeRow(TreeRow):
        def fits(self, sample, budget: int) -> bool:
            level, shared = self.roots, 0
            for key in _routed_keys(sample):
                if key not in level:
                    break
                level = self.children[level[key]]
                shared += 1
            novel = len(sample["input_ids"]) - shared
            trained = self.trained + int(sample["completion_mask"].sum())
            return len(self.tokens) + novel <= budget and trained <= budget

        def add(self, sample) -> None:
            level, nodes = self.roots, []
            for depth, key in enumerate(_routed_keys(sample)):
                if key not in level:
                    level[key] = len(self.tokens)
                    self.tokens.append(key[0])
                    self.children.append({})
                    self.load += depth + 1
                nodes.append(level[key])
                level = self.children[nodes[-1]]
            self.samples.append(sample)
            self.sample_nodes.append(nodes)
            self.groups.add(sample["group_id"])
            self.trained += int(sample["completion_mask"].sum())

    return RoutedTreeRow


def _routed_keys(sample) -> Iterator[tuple]:
    """Each position's trie key: (token, next token, its routes' bytes; None past the routes)."""
    ids = sample["input_ids"].tolist()
    routes = SAMPLE_ROUTES.find(sample["input_ids"])
    for depth, (token, following) in enumerate(zip(ids, [*ids[1:], None], strict=True)):
        yield token, following, routes[depth].tobytes() if depth < len(routes) else None


def routed_planner_class(planner_class: type) -> type:
    """`planner_class` (TRL's TokenBudgetBatcher or FixedCountBatcher) whose rows are
    `RoutedTreeRow`s. TRL's planners make their rows by the module-level name `TreeRow`; it
    names the routed class only while the planner's own code runs (each step of its generator),
    so the collator and anything else see TRL's class (the planner runs in the training loop's
    thread: the dataloader has no workers)."""
    from trl.experimental.async_grpo import async_grpo_trainer as trainer_module

    routed_row = routed_tree_row_class()

    class RoutedPlanner(planner_class):
        def __iter__(self):
            micro_batches = super().__iter__()
            while True:
                plain, trainer_module.TreeRow = trainer_module.TreeRow, routed_row
                try:
                    rows = next(micro_batches)
                except StopIteration:
                    return
                finally:
                    trainer_module.TreeRow = plain
                yield rows

    return RoutedPlanner


def routes_collator_class():
    """TRL's DataCollatorForRollout with each packed position's routes added to the batch; its
    rows must come from a `routed_planner_class` planner."""
    from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout

    routed_row = routed_tree_row_class()

    class RoutesCollator(DataCollatorForRollout):
        def torch_call(self, examples):
            (rows,) = examples
            if not all(isinstance(row, routed_row) for row in rows):
                raise TypeError(
                    "routing replay: the planner's rows may share positions the rollout routed "
                    "differently; make the planner with routed_planner_class"
                )
            batch = super().torch_call(examples)
            batch["routes"] = packed_routes(rows, batch)
            return batch

    return RoutesCollator


class RoutesByTokens:
    """Sync mode: the routes of the current generation's samples, by (prompt, completion)."""

    def __init__(self) -> None:
        self._routes: dict[tuple, np.ndarray] = {}

    def replace(self, prompts: list, completions: list, routes: list) -> None:
        self._routes = {
            (tuple(p), tuple(c)): r for p, c, r in zip(prompts, completions, routes, strict=True)
        }

    def padded(self, inputs: dict) -> torch.Tensor:
        """[samples, prompt + completion columns, num_routers, top_k] for trl.GRPOTrainer's
        batch: prompts left-padded, completions right-padded (-1: no route)."""
        prompt_ids, prompt_mask = inputs["prompt_ids"].cpu(), inputs["prompt_mask"].cpu()
        completion_ids, completion_mask = (
            inputs["completion_ids"].cpu(),
            inputs["completion_mask"].cpu(),
        )
        rows, prompt_cols = prompt_ids.shape
        columns = prompt_cols + completion_ids.shape[1]
        found = []
        for b in range(rows):
            p, c = int(prompt_mask[b].sum()), int(completion_mask[b].sum())
            key = (
                tuple(prompt_ids[b, prompt_cols - p :].tolist()),
                tuple(completion_ids[b, :c].tolist()),
            )
            if key not in self._routes:
                raise RuntimeError(
                    "routing replay: a training sample whose routes the rollout did not return "
                    "(its prompt and completion match no generated sample)"
                )
            found.append((p, c, self._routes[key]))
        route_shape = found[0][2].shape[1:]
        out = np.full((rows, columns, *route_shape), -1, dtype=np.int32)
        for b, (p, c, recorded) in enumerate(found):
            routes = trainer_routes(recorded)
            out[b, prompt_cols - p : prompt_cols] = routes[:p]
            tail = routes[p : p + c - 1]
            out[b, prompt_cols : prompt_cols + len(tail)] = tail
        return torch.from_numpy(out).to(inputs["prompt_ids"].device)


class WithRoutes:
    """Stands in for the model in trl.GRPOTrainer's `_compute_loss`: each call (a chunk of the
    batch's rows, in order) gets those rows' routes as the forward's keyword argument."""

    def __init__(self, model, routes: torch.Tensor) -> None:
        self.model = model
        self.routes = routes
        self.next_row = 0

    def __call__(self, *args, input_ids, **kwargs):
        rows = input_ids.shape[0]
        routes = self.routes[self.next_row : self.next_row + rows]
        self.next_row += rows
        if tuple(routes.shape[:2]) != tuple(input_ids.shape):
            raise ValueError(
                f"routing replay: routes for {tuple(routes.shape[:2])} tokens, a forward of "
                f"{tuple(input_ids.shape)}"
            )
        return self.model(*args, input_ids=input_ids, **kwargs, **{ROUTES_KWARG: routes})

    def __getattr__(self, name):
        return getattr(self.model, name)
