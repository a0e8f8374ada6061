"""How ``--help`` names values: ``FILE`` and ``[FILE]...`` in the usage line, ``INT`` or ``TEXT`` beside
an option that takes a value, nothing beside a flag. The typer release this project is tested with
(0.29) writes ``{file}``, ``<bool>`` and ``<list[str]>`` instead, which read as placeholders left
unfilled. Applied once, when the command line is imported; a typer without these hooks is left as it is."""
from __future__ import annotations

import re

_NAMES = {"str": "TEXT", "int": "INT", "float": "FLOAT", "bool": "BOOLEAN", "path": "PATH"}


def _label(raw: str) -> str:
    inner = raw.strip("<>")
    inner = re.sub(r"^list\[(.*)\]$", r"\1", inner)
    inner = inner.replace(" range", "")
    return _NAMES.get(inner, inner.upper())


def apply() -> None:
    try:
        from typer import core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    opt, arg = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if opt is not None and hasattr(opt, "display_type_rich") and not getattr(opt, "_vb_tidy", False):
        original = opt.display_type_rich

        def display_type_rich(self, ctx):
            if self.metavar is not None:
                return self.metavar
            if getattr(self, "is_flag", False) or getattr(self, "count", False):
                return None
            got = original(self, ctx)
            if got is None:
                return None
            more = got.endswith("...")
            return _label(got[:-3] if more else got) + ("..." if more else "")

        opt.display_type_rich = display_type_rich
        opt._vb_tidy = True
    if arg is not None and hasattr(arg, "_usage_display_name") and not getattr(arg, "_vb_tidy", False):
        def _usage_display_name(self) -> str:
            name = self.display_name_raw.upper()
            name = name if self.required else f"[{name}]"
            return name + ("..." if self.nargs != 1 else "")

        def _rich_display_name(self) -> str:
            name = self.display_name_raw.upper()
            return name + ("..." if self.metavar is None and self.nargs != 1 else "")

        arg._usage_display_name = _usage_display_name
        if hasattr(arg, "_rich_display_name"):
            arg._rich_display_name = _rich_display_name
        if hasattr(arg, "display_type_rich"):
            def arg_type(self, ctx):
                return None          # the name says it (FILE, CODE)
            arg.display_type_rich = arg_type
        arg._vb_tidy = True
