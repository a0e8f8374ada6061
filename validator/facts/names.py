"""One name per concept: engine setting names and forward-mode names, read from ``rules/settings.json``.

Every module that needs a setting's type, the settings a consumer reads, or a forward mode's name
takes it from here; nothing else keeps a list of them.
"""
from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import Any

from ..errors import InputError
from .knowledge import load
from .limits import echo
from .modes import ALIASES, SGLANG_ENUM, SGLANG_METHODS, Mode

_TYPES = {"int": int, "bool": bool, "str": str}
_DATA = load("settings")


def _types(spec: dict) -> type | tuple:
    t = _TYPES[spec["type"]]
    return (t, type(None)) if spec.get("nullable") else t


#: every known setting -> its entry in the table
SETTINGS = MappingProxyType(_DATA["settings"])
#: settings the engine profiles read from a batch's ``server_args``, with their Python types
BATCH_SETTINGS: MappingProxyType = MappingProxyType(
    {k: _types(v) for k, v in SETTINGS.items() if "batch" in v["used_by"]})
#: settings a launch command's diagnosis interprets (others are kept but not read)
LAUNCH_SETTINGS: tuple = tuple(k for k, v in SETTINGS.items() if "launch" in v["used_by"])
#: settings shown in a one-line summary, in order
SUMMARY_SETTINGS: tuple = tuple(_DATA["summary_order"])
#: other spellings of setting names (vLLM names, short flags)
SETTING_ALIASES = MappingProxyType(_DATA["aliases"])
#: launch-command flags that take no value but are not settings of the table
BOOL_FLAGS_OTHER = frozenset(_DATA["bool_flags_other"]["flags"])
#: settings, and other launch-command flags, that take no value on a command line
BOOL_FLAG_SETTINGS = frozenset(k for k, v in SETTINGS.items() if v.get("bool_flag")) | BOOL_FLAGS_OTHER
#: settings renamed in a release -> the name older releases use (read when the new one is absent)
SETTING_FALLBACKS = MappingProxyType({k: v["fallback"] for k, v in SETTINGS.items() if v.get("fallback")})
#: settings that are environment variables of the engine (set as text in the environment)
ENV_SETTINGS = frozenset(k for k, v in SETTINGS.items() if v.get("env"))
_ENV_VALUES = _DATA["env_values"]


def check_setting_value(name: str, value: Any, where: str) -> None:
    """A setting's value within what the engine takes (``min`` for a count or width, ``choices`` for
    a named mode, from the table); InputError naming ``where`` otherwise. Unset (None) passes."""
    spec = SETTINGS.get(name)
    if spec is None or value is None:
        return
    lo = spec.get("min")
    if lo is not None and type(value) is int and value < lo:
        raise InputError(where, f"expected >= {lo}, got {value}: {spec['values_source']}")
    choices = spec.get("choices")
    if choices and not spec.get("env") and isinstance(value, str) and value not in choices:
        raise InputError(where, f"expected one of {', '.join(choices)}, got {echo(value)}")


def setting_value_ok(name: str, value: Any) -> bool:
    """:func:`check_setting_value` as a predicate."""
    try:
        check_setting_value(name, value, name)
    except InputError:
        return False
    return True


def env_value(name: str, value: Any, where: str) -> Any:
    """An environment switch's value as the engine reads it: booleans from the engine's spellings
    (``"0"``, ``"false"``, ``"1"``, ...), text for text switches; values already typed pass, and
    anything else (a list, a mapping, a number for a text switch) is an InputError: the environment
    holds text."""
    spec = SETTINGS[name]
    if value is None:
        return None
    if spec["type"] == "bool" and not isinstance(value, (str, bool)) and not (type(value) is int and value in (0, 1)):
        spellings = _ENV_VALUES["bool_true"] + _ENV_VALUES["bool_false"]
        raise InputError(where, f"expected one of {', '.join(spellings)} (as the engine reads it), got {echo(value)}")
    if spec["type"] == "str" and not isinstance(value, str):
        raise InputError(where, f"expected text (an environment variable's value), got {echo(value)}")
    if spec["type"] == "bool" and isinstance(value, str):
        low = value.strip().lower()
        if low in _ENV_VALUES["bool_true"]:
            return True
        if low in _ENV_VALUES["bool_false"]:
            return False
        spellings = _ENV_VALUES["bool_true"] + _ENV_VALUES["bool_false"]
        raise InputError(where, f"expected one of {', '.join(spellings)} (as the engine reads it), got {echo(value)}")
    if spec["type"] == "bool" and type(value) is int and value in (0, 1):
        return bool(value)
    if spec["type"] == "str" and isinstance(value, str):
        choices = spec.get("choices")
        if choices and value.strip().lower() not in choices:
            raise InputError(where, f"expected one of {', '.join(choices)}, got {echo(value)}")
        return value.strip().lower() if choices else value
    return value

#: the validator's forward modes (:class:`~validate_batch.facts.modes.Mode`), in the table's order
FORWARD_MODES: tuple = tuple(Mode)
#: forward modes whose extend forwards an engine may route to a prefill kernel
ROUTABLE_MODES: tuple = tuple(m for m in Mode if m.is_routable())
#: other names users write for a mode (None: idle)
MODE_ALIASES = MappingProxyType(ALIASES)
#: SGLang ``ForwardMode`` enum names -> mode (None: idle)
SGLANG_MODES = MappingProxyType(SGLANG_ENUM)
#: SGLang ``ForwardMode`` predicate methods, asked in this order when a mode has no name
SGLANG_MODE_METHODS: tuple = SGLANG_METHODS


def normalize_setting(name: str) -> str:
    """``--chunked-prefill-size`` -> ``chunked_prefill_size``; aliases resolved (``--tp`` -> ``tp_size``)."""
    key = name.strip().lstrip("-").replace("-", "_")
    return SETTING_ALIASES.get(key, key)


def normalize_mode(name: str) -> Mode | None:
    """A forward mode name or alias -> the mode (None: idle). Raises KeyError when unknown."""
    low = name.strip().lower()
    if low in FORWARD_MODES:
        return Mode(low)
    return MODE_ALIASES[low]


def parse_mode(forward_mode: Any) -> Mode | None:
    """Normalize a forward mode name; ``None`` means idle (nothing runs)."""
    return Mode.parse(forward_mode, idle=True)


# ----------------------------------------------------------------------------------- server-argument names
@lru_cache(maxsize=1)
def known_server_args() -> frozenset:
    """Every server-argument name accepted in ``server_args``: the settings table, its aliases, and the
    engines' own argument names per release (``rules/engine_args.json``)."""
    names = set(SETTINGS) | set(SETTING_ALIASES)
    for rec in load("engine_args")["engines"].values():
        names.update(rec["names"])
    return frozenset(names)


def check_server_arg(key: str, where: str) -> str:
    """Normalize a server-argument name; an unknown one (a typo such as ``chunked_prefil_size``) is an
    :class:`InputError` naming the field and the closest known names. Returns the normalized name."""
    norm = normalize_setting(key)
    raw = key.strip().lstrip("-").replace("-", "_")
    known = known_server_args()
    if norm in known or raw in known:
        return norm
    from difflib import get_close_matches     # (only for a name no release knows)

    read = sorted(k for k in SETTINGS if "batch" in SETTINGS[k]["used_by"])
    close = get_close_matches(raw, read, n=2, cutoff=0.75) or get_close_matches(raw, sorted(known), n=2, cutoff=0.8)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else \
        f" (the settings read are: {', '.join(read)})"
    releases = ", ".join(load("engine_args")["engines"])
    raise InputError(where, f"unknown server argument {echo(raw)}: not a setting of any known engine release "
                            f"({releases}){hint}")
