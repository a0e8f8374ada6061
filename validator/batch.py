"""Engine batches (filled in by the engine-profile layer)."""
from __future__ import annotations


def is_batch_like(obj) -> bool:
    return False


def is_batch_document(doc) -> bool:
    return isinstance(doc, dict) and ("requests" in doc or "engine" in doc or "profile" in doc)


def check_batch(obj, gpu=None, kernel=None, **kwargs):
    raise NotImplementedError


def check_batch_document(doc, gpu=None, kernel=None):
    raise NotImplementedError


def render_batch(report, payload, console):
    raise NotImplementedError
