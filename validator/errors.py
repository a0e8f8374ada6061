"""Errors raised for bad input. Rules never raise: they return findings."""
from __future__ import annotations


class InputError(ValueError):
    """Input that cannot be checked: a missing or malformed field.

    ``field`` names the offending field (dotted path, e.g. ``requests[2].extend_tokens``) so that the
    CLI can print a one-line error and exit with status 2.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class NotModelled(InputError):
    """A batch whose configuration reaches an engine path the profile does not model (another
    attention backend, another kernel family, another model's code): it is refused, never judged by
    the wrong path's limits. ``path`` names what the engine runs instead; the CLI prints the one
    line and exits with status 2, like any input that cannot be checked."""

    #: for a step (not a configuration) on such a path: where the engine's source says so, and the step's report
    source: str | None = None
    report = None

    def __init__(self, field: str, path: str, why: str):
        self.path = path
        super().__init__(field, f"not modelled: {why}: the engine runs {path}, which this profile does not model")


class BatchIllegalError(Exception):
    """Raised by :func:`validate_batch.assert_legal` when a batch breaks a kernel or engine limit.

    Attributes: ``report`` (the full :class:`validate_batch.legality.report.Report`), ``findings`` (its error
    findings) and ``safe_split`` (the minimal split, or ``None`` when no split can help).
    """

    def __init__(self, report):
        self.report = report
        self.findings = [f for f in report.findings if f.is_error]
        head = "; ".join(f"{f.code} {f.message}" for f in self.findings[:3])
        more = f" (+{len(self.findings) - 3} more)" if len(self.findings) > 3 else ""
        super().__init__(f"batch is illegal: {head}{more}")

    @property
    def safe_split(self):
        """The report's minimal split (computed when first read)."""
        return self.report.safe_split
