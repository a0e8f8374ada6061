"""Kernel-mode subcommands (``probe``, ``kernel-check``)."""


def register(app) -> None:
    return None
