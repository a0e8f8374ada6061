"""Batch documents for ``validate_batch.check``: the settings a batch carries, and synthetic prefill and
decode steps with a given number of rows, requests or a given slot."""
from __future__ import annotations

from ..ingest.launch import EngineConfig
from ..facts.modes import Mode
from ..facts.names import BATCH_SETTINGS, ENV_SETTINGS, env_value, setting_value_ok

MAX_SYNTH_REQUESTS = 1 << 16    # requests materialised in one synthetic batch


def _base_type(typ: type | tuple) -> type:
    """``int`` for ``int`` and for a nullable ``(int, NoneType)``."""
    return typ[0] if isinstance(typ, tuple) else typ


def server_args(cfg: EngineConfig, **override) -> dict:
    """The batch ``server_args`` from the configuration (values only when their type is right), with
    the chunk budget per DP rank under DP attention and ``override`` on top."""
    out = {}
    for k, typ in BATCH_SETTINGS.items():
        base = _base_type(typ)
        v = override.get(k, cfg.values.get(k))
        if v is None:
            continue
        if k in ENV_SETTINGS:          # an environment switch as set: "0", 1, "false", ...
            v = env_value(k, v, k)
        if base is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            continue
        if base is bool and not isinstance(v, bool):
            continue
        if base is str:
            v = str(v)
        if not setting_value_ok(k, v):
            continue                   # a value the engine would not start with: read as unknown
        out[k] = v
    if cfg.dp_attention and cfg.chunk_per_rank() is not None:
        out["chunked_prefill_size"] = cfg.chunk_per_rank()
    for k, v in override.items():
        if v is not None and k in BATCH_SETTINGS:
            out[k] = v
    return out


def spec_tokens(cfg: EngineConfig) -> int:
    """Speculative draft tokens per request (0: no speculative decoding, or unknown)."""
    d = cfg.get("speculative_num_draft_tokens")
    return d if isinstance(d, int) and not isinstance(d, bool) and d > 0 else 0


def split_even(total: int, n: int) -> list[int]:
    """``total`` in ``n`` near-equal parts (at most ``total`` parts, at least one)."""
    n = max(1, min(n, max(total, 1)))
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def engine_name(profile: list[str], version: str | None) -> str | list[str]:
    """The batch's ``engine`` field: each profile at ``version`` (when given)."""
    names = [f"{p}@{version}" if version and "@" not in p else p for p in profile]
    return names[0] if len(names) == 1 else names


def prefill_doc(profile, version, gpu, sa, n_seq, rows, cached, running, running_len, label) -> dict:
    """An extend step of ``rows`` new tokens over ``n_seq`` requests, beside ``running`` decodes."""
    reqs = []
    prefix = split_even(cached, n_seq) if cached else None
    for i, t in enumerate(split_even(rows, min(n_seq, MAX_SYNTH_REQUESTS))):
        r = {"id": f"p{i + 1}", "extend_tokens": t}
        if prefix and i < len(prefix):
            r["prefix_len"] = prefix[i]
        reqs.append(r)
    doc = {"label": label, "engine": engine_name(profile, version), "server_args": sa, "forward_mode": "extend",
           "requests": reqs}
    if gpu is not None:
        doc["gpu"] = gpu
    if running:
        doc["running"] = _running(min(running, MAX_SYNTH_REQUESTS), running_len)
    return doc


_RUNNING: dict[tuple[int, int], tuple] = {}


def _running(n: int, seq_len: int) -> list[dict]:
    """``n`` running decodes of ``seq_len`` tokens. A boundary search asks for the same ones in
    every step it tries: they are made once (the last few kept) and each document gets its own list."""
    key = (n, seq_len)
    got = _RUNNING.get(key)
    if got is None:
        if len(_RUNNING) >= 4:
            _RUNNING.clear()
        got = _RUNNING[key] = tuple({"id": f"d{i + 1}", "seq_len": seq_len} for i in range(n))
    return list(got)


_IDS: list[str] = []


def _ids(n: int) -> list[str]:
    """``r1 .. rn`` (made once up to the largest ``n`` asked for)."""
    if len(_IDS) < n:
        _IDS.extend(f"r{i + 1}" for i in range(len(_IDS), n))
    return _IDS[:n]


def decode_doc(profile, version, gpu, sa, n, seq_len, mode: Mode, label, slot: int | None = None,
               slots_used: int | None = None) -> dict:
    """A decode-like step (``mode``) of ``n`` requests; with ``slot``, the last request holds that slot
    and the others the lowest free ones."""
    n = max(1, min(n, MAX_SYNTH_REQUESTS))
    if slot is None and not mode.is_draft_extend():
        reqs = [{"id": rid, "seq_len": seq_len} for rid in _ids(n)]
        doc = {"label": label, "engine": engine_name(profile, version), "server_args": sa, "forward_mode": mode.value,
               "requests": reqs}
        if gpu is not None:
            doc["gpu"] = gpu
        return doc
    reqs = []
    taken = set()
    if slot is not None:
        taken.add(slot)
    nxt = 1
    for i in range(n):
        r: dict = {"id": f"r{i + 1}", "seq_len": seq_len}
        if slot is not None:
            if i == n - 1:
                r["req_pool_idx"] = slot
            else:
                while nxt in taken:
                    nxt += 1
                r["req_pool_idx"] = nxt
                taken.add(nxt)
        if mode.is_draft_extend():
            r = {"id": r["id"], "extend_tokens": max(int(sa.get("speculative_num_draft_tokens") or 1), 1),
                 "prefix_len": seq_len, **({"req_pool_idx": r["req_pool_idx"]} if "req_pool_idx" in r else {})}
        reqs.append(r)
    doc = {"label": label, "engine": engine_name(profile, version), "server_args": sa, "forward_mode": mode.value,
           "requests": reqs}
    if gpu is not None:
        doc["gpu"] = gpu
    return doc
