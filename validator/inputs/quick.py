"""Build a batch document from command-line flags, for quick cases without a file."""
from __future__ import annotations

import re
from typing import Any

from ..errors import InputError
from ..facts.fields import MAX_REQUESTS
from ..facts.limits import echo, parse_int
from ..facts.names import check_server_arg

_INT_TEXT = re.compile(r"\s*[-+]?[0-9_]+\s*")


def _int(text: str, flag: str, what: str) -> int:
    if not _INT_TEXT.fullmatch(text):
        raise ValueError(text)
    return parse_int(text, flag)


def _int_list(text: str, flag: str) -> list[int]:
    """``4096,3x128`` -> [4096, 128, 128, 128]; counts are checked against ``MAX_REQUESTS`` before any
    list is built."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "x" in part:  # "3x4096" = three requests of 4096
            n, _, v = part.partition("x")
            try:
                count, value = _int(n, flag, "count"), _int(v, flag, "value")
            except ValueError:
                raise InputError(flag, f"expected COUNTxVALUE like 3x4096, got {echo(part)}") from None
            if count > MAX_REQUESTS - len(out):
                raise InputError(flag, f"more than {MAX_REQUESTS} requests (got a count of {echo(count)})")
            out.extend([value] * count)
            continue
        if len(out) >= MAX_REQUESTS:
            raise InputError(flag, f"more than {MAX_REQUESTS} requests")
        try:
            out.append(_int(part, flag, "value"))
        except ValueError:
            raise InputError(flag, f"expected comma-separated integers, got {echo(part)}") from None
    if any(v < 0 for v in out):
        raise InputError(flag, f"expected non-negative integers, got {echo(text)}")
    return out


def _value(v: str) -> Any:
    low = v.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if _INT_TEXT.fullmatch(v):
        return parse_int(v, "--server-arg")
    return v.strip()


def batch_doc_from_flags(engine: str, mode: str, extend: str | None, prefix: str | None, decodes: int,
                         seq_len: int, slots: str | None, server_args: list[str], gpu: str | None,
                         env: list[str] | None = None) -> dict:
    sa: dict[str, Any] = {}
    switches: dict[str, str] = {}
    for item in env or ():
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise InputError("--env", f"expected NAME=VALUE, got {echo(item)}")
        switches[k.strip()] = v.strip()      # text, as in the environment; read as the engine reads it
    for item in server_args:
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise InputError("--server-arg", f"expected KEY=VALUE, got {echo(item)}")
        sa[check_server_arg(k, "--server-arg")] = _value(v)
    reqs: list[dict] = []
    if not 0 <= decodes <= MAX_REQUESTS:
        raise InputError("--decode", f"expected 0..{MAX_REQUESTS} requests, got {echo(decodes)}")
    ext = _int_list(extend, "--extend") if extend else []
    pre = _int_list(prefix, "--prefix") if prefix else []
    if pre and len(pre) not in (1, len(ext)):
        raise InputError("--prefix", f"expected 1 or {len(ext)} values (one per --extend), got {len(pre)}")
    mode = mode.lower()
    if mode in ("decode", "target_verify", "verify") and not ext:
        reqs = [{"id": f"r{i + 1}", "seq_len": seq_len} for i in range(decodes)]
        running = []
    else:
        for i, e in enumerate(ext):
            p = pre[0] if len(pre) == 1 else (pre[i] if pre else 0)
            reqs.append({"id": f"p{i + 1}", "extend_tokens": e, "prefix_len": p})
        running = [{"id": f"d{i + 1}", "seq_len": seq_len} for i in range(decodes)]
    if slots:
        sl = _int_list(slots, "--slots")
        if len(sl) != len(reqs):
            raise InputError("--slots", f"expected one slot per request ({len(reqs)}), got {len(sl)}")
        for r, s in zip(reqs, sl):
            r["req_pool_idx"] = s
    if not reqs:
        raise InputError("--extend", "give --extend (prefill tokens per request) or --decode N with --mode decode")
    doc: dict = {"engine": engine, "forward_mode": mode, "server_args": sa, "requests": reqs}
    if switches:
        doc["env"] = switches
    if running:
        doc["running"] = running
    if gpu:
        doc["gpu"] = gpu
    return doc
