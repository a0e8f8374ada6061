"""Forward modes: the one type for the kind of forward a step is, with its predicates.

The members are the validator's forward modes of ``rules/settings.json`` (``forward_modes.modes``);
an idle step (nothing runs) has no mode: :meth:`Mode.parse` gives ``None`` for it where idle is
allowed. The predicates follow SGLang's ``ForwardMode`` (``is_decode()``, ``is_mixed()``, ...)
where they mean the same. A member is a ``str``: it compares equal to its name, hashes like it
and writes as it in JSON and messages.
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from ..errors import InputError
from .knowledge import load
from .limits import echo

_MODES = load("settings")["forward_modes"]


class Mode(str, Enum):
    """A forward mode (the value is its name as the validator and its inputs write it)."""

    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"

    __str__ = str.__str__          # "extend", not "Mode.EXTEND", in messages
    __format__ = str.__format__

    def is_decode(self) -> bool:
        """A decode step: one query row per request."""
        return self is _DECODE

    def is_mixed(self) -> bool:
        """An extend step with running decodes merged into it."""
        return self is _MIXED

    def is_target_verify(self) -> bool:
        """A speculative verify step: draft tokens rows per request."""
        return self is _TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        """A draft model's extend: each request's new tokens (or the draft tokens when it has none)."""
        return self is _DRAFT_EXTEND

    def is_routable(self) -> bool:
        """An extend forward (plain or mixed) an engine may route to a prefill kernel: its rows are
        its requests' new tokens (``forward_modes.routable``)."""
        return self._value_ in _ROUTABLE_NAMES

    def is_decode_or_verify(self) -> bool:
        """Each request is a fixed number of rows (one, or the draft tokens), read from its
        sequence length rather than from new tokens."""
        return self is _DECODE or self is _TARGET_VERIFY

    @classmethod
    def parse(cls, value: Any, field: str = "forward_mode", idle: bool = False) -> "Mode | None":
        """A mode from its name or an alias (``prefill``, ``verify``, ``draft``; any case). With
        ``idle``, ``"idle"`` gives ``None`` (nothing runs); otherwise it is unknown. Raises
        :class:`InputError` naming ``field`` for anything else."""
        m = _BY_NAME.get(value, "?") if type(value) is str else "?"
        if m == "?" and isinstance(value, str):
            m = _BY_NAME.get(value.lower(), "?")
        if m is None and not idle:
            m = "?"
        if m != "?":
            return m
        known = ", ".join(NAMES)
        raise InputError(field, f"expected one of {known}{' or idle' if idle else ''}, got {echo(value)}")


#: the modes' names, in the table's order
NAMES: tuple = tuple(_MODES["modes"])
if NAMES != tuple(m.value for m in Mode):
    raise RuntimeError(f"rules/settings.json forward_modes.modes {NAMES} differ from the Mode type")
# The predicates read the members from these names: on Python 3.11 every ``Mode.X`` goes through the
# enum type's ``__getattr__`` hook (about 0.2 us a read). A member hashes as its name (``str`` comes
# before ``Enum`` in the type's order), so members key a table as cheaply as strings do.
_DECODE, _MIXED, _TARGET_VERIFY, _DRAFT_EXTEND = Mode.DECODE, Mode.MIXED, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND
_ROUTABLE_NAMES = frozenset(Mode(m).value for m in _MODES["routable"])
#: other names users write for a mode -> the mode (None: idle)
ALIASES: dict = {k: (None if v is None else Mode(v)) for k, v in _MODES["aliases"].items()}
_BY_NAME: dict = {**{m.value: m for m in Mode}, **ALIASES, "idle": None}
#: SGLang ``ForwardMode`` enum names -> mode (None: idle)
SGLANG_ENUM: dict = {k: (None if v is None else Mode(v)) for k, v in _MODES["sglang_enum"].items()}
#: SGLang ``ForwardMode`` predicate methods and the mode each means, asked in this order when a
#: mode has no name
SGLANG_METHODS: tuple = tuple((meth, None if v is None else Mode(v)) for meth, v in _MODES["sglang_methods"])
