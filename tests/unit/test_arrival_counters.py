import torch

from rollout.kernels.arrival_counters import MIN_COUNTERS, ArrivalCounters


def test_counters_are_zeroed_shared_until_outgrown_and_outgrown_buffers_are_kept():
    arrivals = ArrivalCounters()
    first = arrivals.get(torch.device("cpu"), 10)
    assert first.dtype == torch.int32 and first.numel() == MIN_COUNTERS
    assert not first.any()
    assert arrivals.get("cpu", MIN_COUNTERS) is first  # launches on one stream share it
    larger = arrivals.get("cpu", MIN_COUNTERS + 1)
    assert larger is not first and larger.numel() == MIN_COUNTERS + 1 and not larger.any()
    # A graph captured with the first buffer keeps its address: the buffer must stay allocated.
    kept = arrivals._buffers[(torch.device("cpu"), 0)]
    assert kept[0] is first and kept[-1] is larger
    assert arrivals.get("cpu", 5) is larger
