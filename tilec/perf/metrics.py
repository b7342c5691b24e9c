"""Profiler-style figures of a scheduled trace, defined as neuron-profile defines them (nki-spec §5).

    MFU = 2 * useful MACs / (2 * 128 * 128 * TensorE clock * total_time)       useful = nc_matmul, not transposes
    HFU = hardware FLOPs / (same peak * total_time)                            hardware = every TensorE instruction
    MBU = (HBM read + HBM write bytes) / total_time / one HBM stack's bandwidth
    engine active time = time with at least one instruction of that engine (or DMA transfer) in flight

A matmul of K contraction partitions, M stationary columns and N moving columns does K*M*N MACs; a TensorE
transpose of a [P, F] tile is a matmul against a P x P identity: P*F*P MACs, counted in HFU only.
"""
from __future__ import annotations

from collections import Counter

from tilec.target import invariant
from tilec.trace import Alloc, Instr

PMAX = invariant("pmax")  # a matmul without its contraction size recorded: a full one


def matmul_macs(ins: Instr) -> int:
    if ins.op == "nc_transpose":
        p_in = ins.k or ins.free
        return p_in * ins.partitions * p_in
    return (ins.k or PMAX) * (ins.m or ins.partitions) * ins.free


def flops(instrs: list[Instr]) -> tuple[int, int]:
    """(useful matmul FLOPs, hardware FLOPs) over the TensorE instructions."""
    useful = hardware = 0
    for ins in instrs:
        if ins.engine != "tensor":
            continue
        f = 2 * matmul_macs(ins)
        hardware += f
        if ins.op == "nc_matmul" and not ins.attr("is_transpose"):
            useful += f
    return useful, hardware


def hbm_bytes(instrs: list[Instr]) -> tuple[int, int]:
    read = write = 0
    for ins in instrs:
        if ins.engine == "dma":
            if any(a.memory == "hbm" for a in ins.reads):
                read += ins.bytes
            if any(a.memory == "hbm" for a in ins.writes):
                write += ins.bytes
    return read, write


def union_ns(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def instr_counts(instrs: list[Instr]) -> dict[str, int]:
    counts = Counter(f"{ins.engine}.{ins.op}" for ins in instrs)
    return dict(sorted(counts.items()))


def peak_per_partition(allocs: list[Alloc], memory: str) -> int:
    """Largest sum of bytes per partition of the buffers of `memory` live at the same instruction."""
    events: list[tuple[int, int]] = []
    for a in allocs:
        if a.memory != memory:
            continue
        last = a.last_seq if a.last_seq >= a.first_seq else a.first_seq
        events.append((a.first_seq, a.bytes_per_partition))
        events.append((last + 1, -a.bytes_per_partition))
    peak = cur = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # frees before allocations at the same seq
        cur += delta
        peak = max(peak, cur)
    return peak
