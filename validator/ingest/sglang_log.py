"""SGLang scheduler log lines (``Prefill batch`` / ``Decode batch``), every known era.

A line is ``[date time( DPn)( PPn)( TPn)( EPn)] Prefill batch<sep> field: value, ...`` where the
separator after "batch" is ``.`` up to 0.5.3 and ``,`` from 0.5.5 (optionally with an ``[N]``
iteration tag). Fields are read generically (``#new-token`` -> ``new_token``); usage blocks of
hybrid-SWA (``full token usage``, ``#swa token``), mamba (``mamba usage``), the 0.4.9 allocator
form (``#token: full=.., swa=..``), PD fields and speculative stats all land in ``fields``.

The era of a line decides when it was printed relative to its forward pass:
* up to 0.5.8 a Prefill line is printed while scheduling, BEFORE its forward: the last line before
  a crash is the crashing batch;
* from 0.5.10 it is printed AFTER the forward: the crashing batch is not in the log.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..errors import InputError
from ..facts.fields import MAX_POSITION, MAX_REQUESTS
from ..facts.limits import echo, parse_int

# "[2026-04-27 16:44:38 DP3 TP6] " with optional .mmm and any reporter placeholder for the time.
_PREFIX = re.compile(
    r"\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?|[^\]\s]*)"
    r"(?P<ranks>(?:\s+(?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\s*\]")
_RANK = re.compile(r"(DP|PP|ATTN_CP|MOE_DP|TP|EP)(\d+)")
_BEFORE_PREFIX = re.compile(r"\(\w+(?: pid=\d+)?(?:,\s*ip=[\d.]+)?\)|[\w.:-]*\|?")
_HEAD = re.compile(
    r"(?P<kind>Prefill|Decode) batch"
    r"(?:\(mixed #running-req: (?P<mixed>\d+)\))?"
    r"(?: \[(?P<iter>\d+)\])?"
    r"(?P<sep>[.,])(?:\s+|$)")
_HEAD_LOOSE = re.compile(r"\b(?:Prefill|Decode) batch\b")
_NUMBER = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?$")
_GRAPH_KEYS = ("cuda_graph", "cpu_graph", "npu_graph", "musa_graph")
MAX_RAW = 400


class LineParseError(ValueError):
    pass


@dataclass
class Prefix:
    timestamp: str | None
    ranks: dict[str, int]
    end: int            # index in the line where the message starts

    @property
    def dp(self) -> int | None:
        return self.ranks.get("DP")

    def label(self) -> str:
        """The scheduling rank this line belongs to: ``DPn`` (plus ``PPn`` with pipeline stages)."""
        parts = []
        if "DP" in self.ranks:
            parts.append(f"DP{self.ranks['DP']}")
        if "PP" in self.ranks:
            parts.append(f"PP{self.ranks['PP']}")
        return " ".join(parts) or "DP0"


def parse_prefix(line: str) -> Prefix | None:
    """The ``[time ranks]`` prefix at the start of a line (after a ``(Proc pid=..)`` tag), or None."""
    m = _PREFIX.search(line, 0, min(len(line), 200))
    if not m:
        return None
    before = line[:m.start()].strip()
    if before and not _BEFORE_PREFIX.fullmatch(before):
        return None
    ts = m.group("ts")
    rk = m.group("ranks")
    ranks = {k: parse_int(v, "rank") for k, v in _RANK.findall(rk)} if rk else {}
    dated = ts[:4].isdigit() and ts[4:5] == "-"
    if not dated and not ranks:
        return None   # "[dump_input.py:79]" and other bracketed words are not SGLang prefixes
    return Prefix(ts if dated else None, ranks, m.end())


_NON_ALNUM = re.compile(r"[^a-z0-9]+")
_SUBFIELD = re.compile(r"(\w+)=(\S+)")
_INT_RE = re.compile(r"[+-]?\d+")


@lru_cache(maxsize=4096)
def norm_field(key: str) -> str:
    k = key.strip().lstrip("#").strip().lower()
    k = _NON_ALNUM.sub("_", k).strip("_")
    return k


def _value(text: str) -> Any:
    t = text.strip()
    if t.isdigit():
        return parse_int(t, "scheduler line")
    if t in ("True", "False"):
        return t == "True"
    if t.endswith("%") and _NUMBER.match(t[:-1]):
        return float(t[:-1])
    if _NUMBER.match(t):
        return parse_int(t, "scheduler line") if _INT_RE.fullmatch(t) else float(t)
    m = _SUBFIELD.fullmatch(t)
    if m:
        return {m.group(1): _value(m.group(2))}
    return t


def parse_fields(body: str) -> tuple[dict[str, Any], list[str], bool, list[str]]:
    """``k: v, k: v, `` -> (fields, key order, trailing comma?, pieces that were not ``k: v``)."""
    fields: dict[str, Any] = {}
    order: list[str] = []
    extra: list[str] = []
    text = body.rstrip()
    trailing = text.endswith(",")
    last: str | None = None
    for piece in text.split(","):
        p = piece.strip()
        if not p:
            continue
        key, colon, val = p.partition(": ")
        if not colon and p.endswith(":"):
            key, colon, val = p[:-1], ":", ""
        if colon:
            k = norm_field(key)
            if k in _GRAPH_KEYS:
                fields["graph_backend"] = k.replace("_graph", "")
                k = "graph"
            fields[k] = _value(val)
            order.append(k)
            last = k
        elif last is not None and _SUBFIELD.fullmatch(p):
            sub, _, v = p.partition("=")   # "#token: full=100, swa=20": swa belongs to #token
            cur = fields.get(last)
            if not isinstance(cur, dict):
                cur = {} if cur is None else {"value": cur}
            cur[sub] = _value(v)
            fields[last] = cur
        else:
            extra.append(p[:80])
    return fields, order, trailing, extra


@dataclass
class Era:
    """What a line's format says about the SGLang version that printed it."""

    label: str
    versions: str
    after_forward: bool | None      # Prefill line printed after its forward (None: unknown)
    rank: int                       # how late the era is (for picking the most specific signal)
    min_version: tuple = (0,)
    max_version: tuple = (99,)

    def compatible(self, other: "Era") -> bool:
        """Could one SGLang release print lines of both eras?"""
        return max(self.min_version, other.min_version) <= min(self.max_version, other.max_version)

    def to_dict(self) -> dict:
        return {"label": self.label, "versions": self.versions, "prefill_logged_after_forward": self.after_forward}


ERA_PERIOD_OLD = Era("E0-E1", "0.3.0-0.4.0 (period separator, 'cache hit rate')", False, 0, (0, 3), (0, 4, 99))
ERA_PERIOD = Era("E2-E4", "0.4.6-0.5.3 (period separator)", False, 1, (0, 4, 1), (0, 5, 4))
ERA_COMMA = Era("E5", "0.5.5-0.5.8 (comma separator, no graph field in Prefill)", False, 2, (0, 5, 4), (0, 5, 9))
ERA_WILD = Era("wild", "between 0.5.8 and 0.5.10 (input throughput before cuda graph); print order unverified", None, 3,
               (0, 5, 8), (0, 5, 10))
ERA_DECODE_NEW = Era("E6+ (decode)", ">=0.5.10 (Decode line without trailing comma)", True, 3, (0, 5, 10))
ERA_610 = Era("E6", "0.5.10 (Prefill ends with graph and input throughput, no #pending-token)", True, 4,
              (0, 5, 10), (0, 5, 11))
ERA_612 = Era("E7+", ">=0.5.12 (#pending-token)", True, 5, (0, 5, 12))
ERA_618 = Era("E8", ">=0.5.18 (#optimistic-req)", True, 6, (0, 5, 18))
ERA_623 = Era("E8", ">=0.5.23 (#replay-token)", True, 6, (0, 5, 23))
ERA_MAIN = Era("E9", "after 0.5.23 (Decode #cached-token)", True, 7, (0, 5, 24))


def era_of(kind: str, sep: str, fields: dict, order: list[str], trailing: bool) -> Era:
    if sep == ".":
        return ERA_PERIOD_OLD if "cache_hit_rate" in fields else ERA_PERIOD
    if kind == "Prefill":
        if "replay_token" in fields:
            return ERA_623
        if "optimistic_req" in fields:
            return ERA_618
        if "pending_token" in fields:
            return ERA_612
        if "graph" in fields:
            if "input_throughput_token_s" in order and order.index("input_throughput_token_s") < order.index("graph"):
                return ERA_WILD
            return ERA_610
        return ERA_COMMA
    if "cached_token" in fields:
        return ERA_MAIN
    return ERA_COMMA if trailing else ERA_DECODE_NEW


@dataclass
class Step:
    """One parsed scheduler line: a sample of what a DP rank scheduled."""

    kind: str                   # "prefill" | "decode"
    line_no: int
    rank: str                   # "DP0", "DP3", "DP0 PP1"
    fields: dict[str, Any]
    era: Era
    timestamp: str | None = None
    iteration: int | None = None
    mixed_running: int | None = None
    raw: str = ""
    extra: list[str] = field(default_factory=list)

    def num(self, key: str, default: int | None = None) -> int | None:
        v = self.fields.get(key)
        if isinstance(v, bool):
            return default
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return default

    @property
    def new_token(self) -> int | None:
        return self.num("new_token")

    @property
    def running_req(self) -> int | None:
        return self.num("running_req", self.mixed_running)

    @property
    def is_spec(self) -> bool:
        return any(k in self.fields for k in ("accept_len", "accept_rate", "cap_len", "block_accept_len"))

    @property
    def is_pd_decode(self) -> bool:
        return any(k in self.fields for k in ("pre_allocated_usage", "transfer_req", "retracted_req"))

    @property
    def is_pd_prefill(self) -> bool:
        return any(k in self.fields for k in ("unbootstrapped_req", "transferring_req", "bootstrap_req", "inflight_req"))

    def summary(self) -> str:
        if self.kind == "prefill":
            keys = ("new_seq", "new_token", "cached_token", "running_req", "queue_req", "pending_token")
        else:
            keys = ("running_req", "accept_len", "prealloc_req", "transfer_req", "retracted_req", "queue_req")
        parts = [(f"#{k.replace('_', '-')}" if k != "accept_len" else "accept len") + f": {self.fields[k]}"
                 for k in keys if k in self.fields]
        if self.mixed_running is not None:
            parts.insert(0, f"mixed #running-req: {self.mixed_running}")
        return f"{self.kind.capitalize()} " + ", ".join(parts)

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "line": self.line_no, "rank": self.rank, "timestamp": self.timestamp,
             "fields": dict(self.fields), "era": self.era.label}
        if self.iteration is not None:
            d["iteration"] = self.iteration
        if self.mixed_running is not None:
            d["mixed_running"] = self.mixed_running
        return d


REQUIRED = {"Prefill": ("new_seq", "new_token"), "Decode": ("running_req",)}
#: counts a line gives that become requests of a reconstructed forward, and token counts that become a
#: request's tokens: held to the limits of one forward before anything is built from them
_REQUEST_COUNTS = ("new_seq", "running_req", "queue_req", "prealloc_req", "transfer_req", "retracted_req",
                   "inflight_req", "bootstrap_req", "transferring_req", "unbootstrapped_req")
_TOKEN_COUNTS = ("new_token", "cached_token", "pending_token", "token")


def _check_counts(fields: dict, mixed: int | None) -> None:
    for keys, limit, what in ((_REQUEST_COUNTS, MAX_REQUESTS, "requests"),
                              (_TOKEN_COUNTS, MAX_POSITION, "tokens")):
        for k in keys:
            v = fields.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > limit:
                raise InputError("scheduler line", f"#{k.replace('_', '-')} {v} is more {what} than one forward "
                                                   f"holds (at most {limit})")
    if mixed is not None and mixed > MAX_REQUESTS:
        raise InputError("scheduler line", f"mixed #running-req {mixed} is more requests than one forward holds "
                                           f"(at most {MAX_REQUESTS})")


def looks_like_batch_line(line: str) -> bool:
    return _HEAD_LOOSE.search(line) is not None


def parse_batch_line(line: str, line_no: int = 0, prefix: Prefix | None = None) -> Step:
    """Parse one ``Prefill batch`` / ``Decode batch`` line. Raises :class:`LineParseError` with the reason."""
    m = _HEAD.search(line)
    if not m:
        raise LineParseError("no 'Prefill batch.'/'Decode batch,' head in the expected form")
    if prefix is None:
        prefix = parse_prefix(line)
    body = line[m.end():]
    fields, order, trailing, extra = parse_fields(body)
    kind = m.group("kind")
    mixed = parse_int(m.group("mixed"), "scheduler line") if m.group("mixed") else None
    missing = [k for k in REQUIRED[kind] if not isinstance(fields.get(k), int) or isinstance(fields.get(k), bool)]
    if kind == "Prefill" and mixed is not None:
        missing = [k for k in missing if k != "running_req"]
    if missing:
        raise LineParseError(f"missing or non-integer field(s): {', '.join('#' + k.replace('_', '-') for k in missing)}")
    _check_counts(fields, mixed)
    era = era_of(kind, m.group("sep"), fields, order, trailing)
    return Step(kind.lower(), line_no, prefix.label() if prefix else "DP0", fields, era,
                prefix.timestamp if prefix else None, parse_int(m.group("iter"), "scheduler line") if m.group("iter") else None,
                mixed, line.strip()[:MAX_RAW], extra)


# --------------------------------------------------------------------------------- versions
def parse_version(text: str, where: str = "--sglang-version") -> tuple[int, ...]:
    """``0.5.12``, ``v0.5.10.post1``, ``0.5.10rc0`` -> (0, 5, 10)."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not m:
        raise InputError(where, f"expected a version like 0.5.12, got {echo(text)}")
    return tuple(parse_int(x, where) for x in m.groups() if x is not None) + ((0,) if m.group(3) is None else ())


def after_forward_for_version(v: tuple[int, ...]) -> bool:
    """From 0.5.10 on, a Prefill line is printed after its forward (checked 0.5.10..0.5.23)."""
    return tuple(v[:3]) >= (0, 5, 10)
