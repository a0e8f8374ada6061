"""The metadata DeepGEMM's SM90 paged MQA-logits scheduler writes (``get_paged_mqa_logits_metadata``, one
context length per request): which request and which KV split each SM starts at.

A plain-Python account of the non-varlen SM90 path, so that a recorded metadata tensor can be compared
with it value for value (read at vLLM 0.33.0's bundled deep_gemm 2.8.1,
``deep_gemm/include/deep_gemm/scheduler/sm90_paged_mqa_logits.cuh``; the split length from DeepGEMM
54e2261 ``csrc/jit_kernels/impls/sm90_fp8_mqa_logits.hpp:205``):

1. Each request is cut into ``ceil(context_len / split_kv)`` KV splits (the last of its ``next_n`` lengths
   when the lengths are two-dimensional); a running sum over the requests gives each one's end.
2. Each request counts ``atoms`` times (its query tokens in scheduler items: :func:`atoms_for`); the ``total`` splits are
   dealt out to the SMs in order, ``total // num_sms`` each, the last ``total % num_sms`` SMs one more.
3. SM ``i`` starts at split ``i * q + max(i - (num_sms - r), 0)``: the request it falls in (a binary search
   over the running sums), the item within the request, and the split within the item.
4. Row ``num_sms`` is ``(batch * atoms, 0)``; when every length is 0 every row is.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Sequence


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def atoms_for(facts: dict, next_n: int) -> int:
    """Scheduler items per request for a version's ``schedule`` facts: ``atoms`` when the version
    gives one number for every ``next_n`` (vLLM 0.33's 2.8.1: 1), else ``ceil(next_n / next_n_atom)``
    from ``next_n`` 2 on and 1 at ``next_n`` 1 (DeepGEMM 54e2261: items of up to 2 query tokens)."""
    if "atoms" in facts:
        return int(facts["atoms"])
    return 1 if next_n < 2 else _cdiv(next_n, int(facts["next_n_atom"]))


def mqa_metadata(context_lens: Sequence[int], num_sms: int, split_kv: int = 256, atoms: int = 1) -> list[list[int]]:
    """The ``[num_sms + 1, 2]`` schedule metadata for ``context_lens`` (one per request)."""
    batch = len(context_lens)
    ends, total_splits = [], 0
    for n in context_lens:
        total_splits += _cdiv(int(n), split_kv)
        ends.append(total_splits)
    total = total_splits * atoms
    if total == 0:
        return [[batch * atoms, 0] for _ in range(num_sms + 1)]
    q, r = divmod(total, num_sms)
    pivot = num_sms - r
    scaled = [e * atoms for e in ends]
    rows = []
    for sm in range(num_sms):
        start = sm * q + (sm - pivot if sm > pivot else 0)
        i = min(bisect_right(scaled, start), batch - 1)
        offset = start - (scaled[i - 1] if i else 0)
        segs = ends[i] - (ends[i - 1] if i else 0)
        item, split = (offset // segs, offset % segs) if segs else (0, 0)
        rows.append([i * atoms + item, split])
    rows.append([batch * atoms, 0])
    return rows
