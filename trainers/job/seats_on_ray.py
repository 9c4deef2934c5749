"""The plan's seats put into Ray: the cluster's nodes read from it, one placement group whose
bundles are pinned to the planned nodes (so what `--plan` prints is where Ray puts them), and
what a Ray started here is given (CPUs, the GPUs it may hand out)."""

from __future__ import annotations

import contextlib
import math
import os
import socket
from typing import Any

from trainers.job.placement import MIN_BUNDLE_CPU, Node, Placement, PlacementError, Seat


def ray_address_answers(address: str, timeout_s: float = 10.0) -> str | None:
    """None when something accepts a connection at a `host:port` address (or `ray://host:port`)
    within `timeout_s`, else why not. Ray itself retries an address that does not answer for
    minutes before giving up, so the job asks first. Other forms (`auto`, `local`, another
    scheme such as a dashboard's http://) are Ray's to resolve."""
    bare = address.removeprefix("ray://")
    host, sep, port = bare.rpartition(":")
    if "://" in bare or not sep or not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as err:  # refused, unknown host, unreachable, timed out
        return str(err) or type(err).__name__


def cluster_nodes(ray) -> list[Node]:
    """The live nodes of the Ray this process is connected to, with their total resources (what
    the layout is planned against; other jobs' use shows up as a wait for the placement group)."""
    driver = ray.get_runtime_context().get_node_id()
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        resources = n.get("Resources", {})
        nodes.append(
            Node(
                n["NodeID"],
                n.get("NodeManagerAddress", "?"),
                float(resources.get("CPU", 0.0)),
                int(resources.get("GPU", 0.0)),
                n["NodeID"] == driver,
            )
        )
    return nodes


def local_ray_cpus(placement: Placement) -> int:
    """CPUs for a Ray started here: the machine's, or what the layout's Ray seats ask for."""
    seats = (*(() if placement.trainer_in_driver else placement.ranks), *placement.actors)
    need = sum(max(s.cpus, MIN_BUNDLE_CPU) for s in seats)
    return max(os.cpu_count() or 1, math.ceil(need))


def placement_group_for(placement: Placement, ray, timeout_s: float = 600.0):
    """One Ray placement group for the seats the job starts (the trainer's ranks unless it runs
    in this process, and the actors), each bundle pinned to its planned node. Returns it with
    the bundle index of every seat: {("trainer"|"actor", index): bundle}."""
    from ray.util.placement_group import placement_group

    bundles, selectors, index = [], [], {}
    for seat in (*(() if placement.trainer_in_driver else placement.ranks), *placement.actors):
        partner = _bundle_of_gpu(seat, index, bundles)
        if partner is not None:  # the rank's GPU: its actor joins the rank's bundle
            bundles[partner]["CPU"] += max(seat.cpus, MIN_BUNDLE_CPU)
            index[(seat.role, seat.index)] = partner
            continue
        bundle = {"CPU": max(seat.cpus, MIN_BUNDLE_CPU)}
        if seat.gpu is not None:
            bundle["GPU"] = 1.0
        index[(seat.role, seat.index)] = len(bundles)
        bundles.append(bundle)
        selectors.append(
            {"ray.io/node-id": seat.node.node_id} if seat.node.node_id != "local" else {}
        )
    group = placement_group(bundles, strategy="PACK", bundle_label_selector=selectors)
    ready = group.ready()
    done, _ = ray.wait([ready], timeout=timeout_s)
    if not done:
        ray.util.remove_placement_group(group)
        raise PlacementError(
            f"the cluster did not free the resources of this layout in {timeout_s:.0f} s "
            f"({bundles}); other jobs hold them: wait, or plan a smaller layout (--plan shows it)"
        )
    return group, index


def _bundle_of_gpu(seat: Seat, index: dict, bundles: list[dict]) -> int | None:
    """The bundle already holding this seat's GPU (a colocated actor's rank), if any."""
    if seat.role != "actor" or seat.gpu is None or seat.gpu_share >= 1.0:
        return None
    return index.get(("trainer", seat.index))


def scheduling(group, bundle: int) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=bundle
    )


def ray_visible_devices(gpus: list[int], environ: dict[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES for a Ray started here that should hand out only `gpus` (indices as
    this process sees them, mapped through any CUDA_VISIBLE_DEVICES it already has): Ray then
    numbers and assigns exactly those devices."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    physical = visible.split(",") if visible else None
    return ",".join(physical[i] if physical else str(i) for i in gpus)


@contextlib.contextmanager
def ray_sees(gpus: list[int] | None):
    """CUDA_VISIBLE_DEVICES = `gpus` while Ray starts (its node process inherits it and hands
    out only those), then back as it was for this process."""
    if gpus is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ray_visible_devices(gpus, os.environ)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
