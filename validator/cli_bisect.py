"""Crash-report subcommand (``bisect``)."""


def register(app) -> None:
    return None
