"""The safe split in words: the one rendering every output uses (a report, ``explain``, bisect).

Works on :meth:`validate_batch.legality.split.SafeSplit.to_dict` (what reports and diagnoses carry).
"""
from __future__ import annotations

import textwrap


def piece(c: dict) -> str:
    """One request's part of a chunked step: ``id[start:end]``, or the id of a merged decode."""
    if c.get("decode") or "tokens" not in c:
        return str(c.get("id"))
    return f"{c['id']}[{c['start']}:{c['start'] + c['tokens']}]"


def abbreviated(items: list, unit: str, most: int = 4) -> str:
    """``a, b, c`` or, for more than ``most``, ``N unit (first .. last)``."""
    items = [str(x) for x in items]
    if len(items) <= most:
        return ", ".join(items)
    return f"{len(items)} {unit} ({items[0]} .. {items[-1]})"


STEP_MOST = 8


def step_items(items: list, unit: str = "requests", most: int = STEP_MOST) -> str:
    """One step's requests: ``a, b, c`` or, for more than ``most``, ``first..last (N unit)``."""
    items = [str(x) for x in items]
    if len(items) <= most:
        return ", ".join(items)
    return f"{items[0]}..{items[-1]} ({len(items)} {unit})"


def wrapped(lines: list[str], width: int | None) -> list[str]:
    """Lines cut at word boundaries to ``width`` columns, continuation lines indented two more than
    the line; unchanged when ``width`` is None."""
    if not width or width < 20:
        return list(lines)
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out.extend(textwrap.wrap(line, width=width, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False) or [line])
    return out


def split_lines(sp: dict) -> list[str]:
    """The whole account: steps, chunked steps, the naive guard, the settings that prevent it."""
    lines = ["safe split:"]
    if not sp.get("possible"):
        lines.append(f"  none: {sp.get('reason', '')}")
    else:
        steps, chunked = sp.get("steps"), sp.get("chunked_steps")
        if steps is not None:
            lines.append(f"  {len(steps)} step(s), whole requests in order:")
            lines.extend(f"    step {i}: {step_items(st)}" for i, st in enumerate(steps, 1))
        elif sp.get("unchunked_reason"):
            lines.append(f"  without chunking: impossible - {sp['unchunked_reason']}")
        if chunked is not None:
            lines.append(f"  {len(chunked)} step(s) with chunked prefill:")
            lines.extend(f"    step {i}: {step_items([piece(c) for c in st], 'pieces')}" for i, st in enumerate(chunked, 1))
    nv = sp.get("naive_guard")
    if nv is not None:
        tail = (f"still crashes: {', '.join(nv['illegal_steps'])} alone break(s) the limit" if nv["crashes"]
                else "legal here")
        lines.append(f"  naive guard ({nv['rule']}): {nv['steps']} step(s); {tail}")
    lines.extend(f"  prevent: {s['flag']} {s['value']} - {s['why']}" for s in sp.get("settings") or ())
    return lines


def split_summary(sp: dict, max_steps: int = 6) -> str:
    """One line: the steps (long lists abbreviated), or why there is none."""
    if not sp.get("possible"):
        return f"safe split: none ({sp.get('reason', '')})"
    more = lambda n: " ..." if n > max_steps else ""  # noqa: E731
    if sp.get("num_steps"):
        steps = sp["steps"]
        return (f"safe split: {len(steps)} step(s) of whole requests: "
                + "; ".join(abbreviated(st, "requests") for st in steps[:max_steps]) + more(len(steps)))
    if sp.get("num_chunked_steps"):
        steps = sp["chunked_steps"]
        return (f"safe split: {len(steps)} chunked step(s): "
                + "; ".join(abbreviated([piece(c) for c in st], "pieces") for st in steps[:max_steps]) + more(len(steps)))
    return ""
