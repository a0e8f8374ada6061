"""Engine configuration from launch commands, ``server_args=ServerArgs(...)`` log lines and user flags.

Every value remembers where it came from (:class:`EngineConfig.sources`), because the same flag can
mean different things: with ``--enable-dp-attention`` SGLang divides ``--chunked-prefill-size`` by
the attention-DP width (``dp_size``; ``attn_dp_size`` from SGLang 0.5.23) while resolving its arguments, so
the value in a ``ServerArgs(...)`` line is per DP rank
while the value on the command line is global.

Precedence, lowest first: defaults < launch command in the log < ``ServerArgs`` line in the log
< crash dump < ``--launch`` given by the user < ``--server-arg KEY=VALUE`` given by the user.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import InputError
from ..facts.knowledge import load
from ..facts.limits import echo
from ..facts.names import BOOL_FLAG_SETTINGS, LAUNCH_SETTINGS, check_server_arg, normalize_setting
from .reprparse import Call, parse_call_at, scalar

LAUNCH_MARKERS = (
    re.compile(r"(?:^|[\s/'\"`])(?:python3?(?:\.\d+)?\s+-m\s+)?sglang\.launch_server\b|\S*sglang/launch_server\.py\b"),
    re.compile(r"(?:^|[\s/'\"`])sglang\s+serve\b"),
    re.compile(r"(?:^|[\s/'\"`])(?:python3?(?:\.\d+)?\s+-m\s+)?sglang\.bench_one_batch\b"),
    re.compile(r"(?:^|[\s/'\"`])(?:python3?(?:\.\d+)?\s+-m\s+)?sglang\.bench_offline_throughput\b"),
    re.compile(r"(?:^|[\s/'\"`])(?:python3?(?:\.\d+)?\s+-m\s+)?vllm\.entrypoints\.openai\.api_server\b"),
    re.compile(r"(?:^|[\s/'\"`])vllm\s+serve\b"),
)
SGLANG_MARKERS = 4          # the first four markers start an SGLang command, the others a vLLM one
#: the benchmark entry points (not servers): which marker starts each
BENCH_ENTRY_POINTS = {"sglang.bench_one_batch": 2, "sglang.bench_offline_throughput": 3}
ENTRY_POINTS = ("sglang.launch_server", "sglang.bench_one_batch", "sglang.bench_offline_throughput",
                "vllm.entrypoints.openai.api_server", "launch_server.py")
# "<path>", "<your-model>", "${MODEL}", "$MODEL": a value the user left to be filled in.
PLACEHOLDER = re.compile(r"^(?:<[^<>\s]+>|\$\{?\w+\}?|\.\.\.|…)$")
MAX_LAUNCH_CHARS = 256 * 1024


def coerce(text: str) -> Any:
    """A command-line value -> int / float / bool / None / str."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    return scalar(t)


def entry_point(command: str) -> str | None:
    """The benchmark the command runs (``sglang.bench_one_batch``: one extend forward of the whole batch;
    ``sglang.bench_offline_throughput``: an engine fed a generated dataset), or None for a server."""
    return next((name for name, i in BENCH_ENTRY_POINTS.items() if LAUNCH_MARKERS[i].search(command)), None)


def _bench_flag(key: str, bench: str | None) -> str:
    """A benchmark flag written as a unique prefix of its name (argparse takes ``--random-input`` for
    ``--random-input-len``), spelled out; any other key as it is."""
    if bench is None:
        return key
    names = list(load("bisect")["bench_flags"].get(bench, {}))
    if key in names:
        return key
    hits = [n for n in names if n.startswith(key)]
    return hits[0] if len(hits) == 1 else key


def find_launch(line: str) -> tuple[str, int] | None:
    """``(engine, offset)`` where a launch command starts in ``line``, or ``None``."""
    if "sglang" not in line and "vllm" not in line:
        return None
    for i, pat in enumerate(LAUNCH_MARKERS):
        m = pat.search(line)
        if m:
            return ("sglang" if i < SGLANG_MARKERS else "vllm"), m.start()
    return None


_SHELL_END = re.compile(r"^(?:\||&&|;|&|\|\||\d*[<>].*|&>.*)$")


def _is_shell_end(tok: str) -> bool:
    return bool(_SHELL_END.match(tok)) and not PLACEHOLDER.match(tok)


def _flag(tok: str) -> bool:
    """``--flag`` or a single-dash long flag as pasted (``-dp 8``, ``-tp``); not ``-1`` or ``-m``."""
    return tok.startswith("--") or bool(re.match(r"-[A-Za-z][\w-]+(?:=|$)", tok))


def unmarkdown(text: str) -> str:
    """A command as pasted from markdown: code fences, inline backticks and a ``$ `` prompt removed."""
    lines = [ln for ln in text.replace("\r\n", "\n").split("\n") if not ln.strip().startswith("```")]
    out = " ".join(ln.strip().removeprefix("$ ").rstrip("\\").strip() for ln in lines)
    return out.replace("`", " ")


def parse_launch(command: str, where: str = "--launch", notes: list[str] | None = None) -> dict[str, Any]:
    """Flags of an ``sglang.launch_server`` / ``sglang.bench_one_batch`` / ``sglang serve`` / ``vllm serve``
    command -> {name: value}.

    ``--flag value``, ``--flag=value``, single-dash long flags (``-dp 8``), bare boolean flags and
    multi-value flags (a list) are understood; a positional argument after ``serve`` is the model
    path; markdown backticks and code fences are removed. A value left as a placeholder (``<path>``,
    ``$MODEL``) is not a setting: it is dropped, and said in ``notes`` when given.
    """
    text = unmarkdown(command.replace("\\\n", " ").replace("\\\r\n", " "))
    if len(text) > MAX_LAUNCH_CHARS:
        raise InputError(where, f"launch command longer than {MAX_LAUNCH_CHARS} characters")
    hit = find_launch(text)
    if hit is not None:
        text = text[hit[1]:]
    elif not _flag(text.strip().split(" ", 1)[0]):
        raise InputError(where, "expected 'python -m sglang.launch_server ...', 'sglang serve ...', 'vllm serve ...', "
                                f"'python -m sglang.bench_one_batch ...', 'python -m sglang.bench_offline_throughput ...' "
                                f"or bare --flags, got {echo(text.strip()[:60])}")
    try:
        toks = shlex.split(text, comments=False, posix=True)
    except ValueError:
        toks = text.split()   # unbalanced quotes in a pasted command: fall back to whitespace
    # Drop everything up to the entry point.
    start = 0
    for i, t in enumerate(toks):
        if t.endswith(ENTRY_POINTS) or (
                t == "serve" and i > 0 and toks[i - 1].endswith(("sglang", "vllm"))):
            start = i + 1
            break
    bench = entry_point(" ".join(toks[:start])) if start else None
    toks = toks[start:]
    out: dict[str, Any] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if _is_shell_end(t):
            break   # end of the command in a shell line
        if not _flag(t):
            if i == 0 and "model_path" not in out:
                if PLACEHOLDER.match(t):
                    _placeholder(notes, where, "model_path", t)
                else:
                    out["model_path"] = t
            i += 1
            continue
        name, eq, inline = t.lstrip("-").partition("=")
        key = _bench_flag(normalize_setting(name), bench)
        if not key:
            i += 1
            continue
        if eq:
            if PLACEHOLDER.match(inline):
                _placeholder(notes, where, key, inline)
            else:
                out[key] = coerce(inline)
            i += 1
            continue
        if key in BOOL_FLAG_SETTINGS:
            nxt = toks[i + 1].lower() if i + 1 < len(toks) else ""
            if nxt in ("true", "false"):
                out[key] = nxt == "true"
                i += 2
            else:
                out[key] = True
                i += 1
            continue
        vals = []
        j = i + 1
        while j < len(toks) and not _flag(toks[j]) and not _is_shell_end(toks[j]):
            vals.append(toks[j])
            j += 1
        if vals and all(PLACEHOLDER.match(v) for v in vals):
            _placeholder(notes, where, key, " ".join(vals))
        elif not vals:
            out[key] = True
        else:
            out[key] = coerce(vals[0]) if len(vals) == 1 else [coerce(v) for v in vals]
        i = j
    return out


def _placeholder(notes: list[str] | None, where: str, key: str, value: str) -> None:
    if notes is not None:
        notes.append(f"{where}: --{key.replace('_', '-')} {value} is a placeholder, not a value: {key} is not known")


def parse_server_arg_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``--server-arg KEY=VALUE`` items -> {key: value}; a malformed item names itself."""
    out: dict[str, Any] = {}
    for it in items:
        key, eq, val = it.partition("=")
        if not eq or not key.strip():
            raise InputError("--server-arg", f"expected KEY=VALUE (e.g. chunked_prefill_size=8192), got {echo(it)}")
        try:
            out[check_server_arg(key, "--server-arg")] = coerce(val)
        except InputError as e:
            if e.field == "--server-arg":
                raise
            raise InputError("--server-arg", f"{echo(key.strip())}: {e.message}") from None
    return out


def server_args_from_line(line: str) -> tuple[dict[str, Any], bool] | None:
    """``server_args=ServerArgs(...)`` (or a bare ``ServerArgs(...)``) -> ({field: value}, complete)."""
    call = parse_call_at(line, "ServerArgs", partial=True)
    if call is None:
        return None
    return {k: _plain_value(v) for k, v in call.kwargs.items()}, call.complete


def _plain_value(v: Any) -> Any:
    if isinstance(v, Call):
        return v.name
    if isinstance(v, str):
        m = re.match(r"<[\w.]+\.(\w+): '?([^'>]*)'?>$", v)
        if m:   # enum repr  <DisaggregationMode.DECODE: 'decode'>
            return scalar(m.group(2))
        if re.match(r"[A-Z]\w*\.[A-Z_]+$", v):  # DisaggregationMode.DECODE
            return v.rsplit(".", 1)[1].lower()
    return v


DP_CHUNK_WARNING = re.compile(r"chunked prefill size is adjusted (?:from (\d+) )?to (-?\d+)")


@dataclass
class EngineConfig:
    """Engine settings with their provenance. ``per_rank`` flags hold values already divided per DP rank."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    engine: str | None = None          # "sglang" | "vllm" when known
    entry_point: str | None = None     # the command's entry point when it is not a server (sglang.bench_one_batch)
    per_rank_chunk: bool = False       # chunked_prefill_size already divided by dp_size
    notes: list[str] = field(default_factory=list)

    def update(self, values: Mapping[str, Any], source: str, per_rank_chunk: bool | None = None) -> None:
        for k, v in values.items():
            self.values[k] = v
            self.sources[k] = source
        if per_rank_chunk is not None and "chunked_prefill_size" in values:
            self.per_rank_chunk = per_rank_chunk

    def get(self, key: str, default: Any = None) -> Any:
        v = self.values.get(key)
        return default if v is None else v

    @property
    def dp_size(self) -> int:
        v = self.get("dp_size", 1)
        return v if isinstance(v, int) and v >= 1 else 1

    @property
    def attn_dp_size(self) -> int:
        """The attention data-parallel width: ``attn_dp_size`` (SGLang 0.5.23), or ``dp_size`` under
        ``enable_dp_attention`` (older releases); 1 without attention DP."""
        v = self.get("attn_dp_size", 1)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return v
        return self.dp_size if bool(self.get("enable_dp_attention", False)) else 1

    @property
    def dp_attention(self) -> bool:
        return self.attn_dp_size > 1

    def chunk_per_rank(self) -> int | None:
        """The chunked-prefill budget of one DP-attention rank (None when chunking is off)."""
        c = self.get("chunked_prefill_size")
        if not isinstance(c, int) or isinstance(c, bool) or c <= 0:
            return None
        if self.dp_attention and not self.per_rank_chunk:
            return c // self.attn_dp_size
        return c

    def max_prefill_tokens(self) -> int | None:
        v = self.get("max_prefill_tokens")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    def running_limit_per_rank(self) -> int | None:
        r = self.get("max_running_requests")
        if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
            return None
        return r // self.attn_dp_size if self.dp_attention else r

    def to_dict(self) -> dict:
        keys = [k for k in LAUNCH_SETTINGS if k in self.values]
        return {
            "engine": self.engine,
            **({"entry_point": self.entry_point} if self.entry_point else {}),
            "values": {k: self.values[k] for k in keys},
            "sources": {k: self.sources[k] for k in keys},
            "chunked_prefill_size_per_rank": self.chunk_per_rank(),
            "notes": list(self.notes),
        }
