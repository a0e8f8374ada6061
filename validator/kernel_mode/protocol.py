"""The child's side of kernel mode's marker protocol: the line prefixes a child prints on stdout and
the exceptions a backend raises when a job cannot say anything about the call.

Kept apart from :mod:`.outcome` (the parent's reading of a finished child) so that a child imports
nothing but this: the parent's error-line table (:mod:`validate_batch.ingest.recognisers`) stays out of it.
"""
from __future__ import annotations

MARKER = "@@validate-batch"
STAGE_PREFIX = f"{MARKER} stage "
PARTIAL_PREFIX = f"{MARKER} partial "
RESULT_PREFIX = f"{MARKER} result "
#: a serving child (``worker --serve``) prints this before each job it takes, then the job's lines
BEGIN_PREFIX = f"{MARKER} begin "


class Unavailable(Exception):
    """Raised in the child: the job cannot run here at all (torch, a CUDA GPU or FlashMLA is missing)."""


class Unsupported(Exception):
    """Raised in the child: the provider lacks a feature the call needs (the call says nothing about limits)."""
