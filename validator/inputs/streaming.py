"""Call records read twice from a file instead of held in memory: the path ``metadata`` takes on JSON Lines.

A first pass parses every line, holds it to :mod:`validate_batch.facts.limits`, validates it into a call and plans
it, keeping only the first error; a second pass reads the lines again and hands out one plan at a time.
Peak memory is then one record and its plan, not the whole input. Every input is first copied to a
private temporary file, under the same byte budget as any input: the second pass reads the bytes the
first pass checked, whatever happens to the file meanwhile.

Every input the first pass cannot vouch for (a single JSON value, a JSON array, YAML, a line that does
not parse, a record past the size limits) is handed back to :func:`validate_batch.inputs.documents.parse_documents`
whole, so its documents, and its error, are exactly those of the whole-document reader.
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import IO, Any, Iterator, Optional

from ..facts import limits
from ..errors import InputError
from ..flashmla.calls import call_from_record
from ..flashmla.plan import plan as make_plan
from .documents import MAX_INPUT_BYTES, is_device_header, loads_document, parse_documents
from ..facts.knowledge import gpu_from_fields, resolve_gpu
from ..facts.limits import echo

CHUNK = 1 << 16


def open_input(path: str, limit: int = MAX_INPUT_BYTES) -> tuple[IO[bytes], str]:
    """A binary file object that can be read from the start again (``seek(0)``) and the display name;
    the same errors as :func:`validate_batch.inputs.documents.read_text` (missing, a directory, unreadable, more than
    ``limit`` bytes). The input (a file, stdin, a pipe or a device) is copied to a private temporary
    file (removed when closed), so both passes read the same bytes."""
    if path == "-":
        return _spool(getattr(sys.stdin, "buffer", sys.stdin), limit, "<stdin>"), "<stdin>"
    if not os.path.exists(path):
        raise InputError("FILE", f"{echo(path)}: no such file")
    if os.path.isdir(path):
        raise InputError("FILE", f"{echo(path)}: is a directory")
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise InputError("FILE", f"{echo(path)}: {e.strerror or e}") from None
    try:
        with fh:
            # a regular file is copied too: the second pass then reads what the first pass checked,
            # even when the file is edited, appended to or truncated in between
            return _spool(fh, limit, path), path
    except OSError as e:
        raise InputError("FILE", f"{echo(path)}: {e.strerror or e}") from None


def _spool(src: Any, limit: int, name: str) -> IO[bytes]:
    out = tempfile.TemporaryFile()
    try:
        for chunk in limits.bounded_chunks(src, limit, name, size=CHUNK):
            out.write(chunk)
        out.seek(0)
        return out
    except BaseException:
        out.close()
        raise


def _content_lines(fh: IO[bytes]) -> Iterator[str]:
    """The lines that are not blank, decoded as the whole-document reader decodes its text (UTF-8,
    bad bytes replaced: a newline byte is never part of a UTF-8 sequence, so line by line is the same)."""
    fh.seek(0)
    for raw in fh:
        line = raw.decode("utf-8", errors="replace")
        if line.strip():
            yield line


class CallRecords:
    """The call records of one input, checked by a first pass; :meth:`plans` is the second.

    ``streamed`` is False when the input is not JSON Lines of two or more records that parse and keep
    to the size limits: ``docs`` then holds its documents as :func:`parse_documents` reads them (or
    the reading raised its error)."""

    def __init__(self, path: str, gpu_opt: Optional[str], build: Optional[str]):
        self.fh, self.name = open_input(path)
        self.gpu_opt, self.kernel = gpu_opt, build
        self.docs: Optional[list] = None
        try:
            self.streamed = self._first_pass()
            if not self.streamed:
                self.fh.seek(0)
                text = self.fh.read().decode("utf-8", errors="replace")
                self.close()
                self.docs = parse_documents(text, self.name)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.fh.close()

    def _first_pass(self) -> bool:
        lines = _content_lines(self.fh)
        first = next(lines, None)
        if first is None or first.lstrip()[:1] not in ("{", "["):
            return False
        nodes = 1                                   # the list of documents
        header = False
        g = None
        # the whole-document path's order: the device header and --gpu, then every record, then every plan
        setup_error = record_error = plan_error = None
        count = 0
        planned: set = set()
        for no, line in enumerate(_chain(first, lines)):
            try:
                doc = loads_document(line)
                nodes += limits.check_tree(doc, "FILE")
            except Exception:
                return False                        # the whole-document reader says what is wrong
            if nodes > limits.MAX_NODES:
                return False
            if no == 0:
                header = is_device_header(doc)
                try:
                    g = gpu_from_fields(doc, "device header") if header else None
                    if self.gpu_opt:
                        g = resolve_gpu(self.gpu_opt)
                    g = g or resolve_gpu("H200")
                except InputError as e:
                    setup_error = e
                if header:
                    continue
            if setup_error is None and record_error is None:
                try:
                    call = call_from_record(doc, f"calls[{count}]")
                except InputError as e:
                    record_error = e
                else:
                    # planning refuses a call only when its build lacks the call's kernel (the generation of
                    # its path and use_legacy on this GPU's arch): planning one call per such key finds it
                    key = (type(call), getattr(call, "kind", None), call.use_legacy, getattr(call, "entry", None))
                    if plan_error is None and key not in planned:
                        try:
                            make_plan(call, g, self.kernel)
                            planned.add(key)
                        except InputError as e:
                            plan_error = e
            count += 1
        if count + header < 2:
            return False                            # one document: not JSON Lines
        self.header, self.gpu, self.count = header, g, count
        error = setup_error or record_error or plan_error
        if error is not None:
            raise error
        return True

    def plans(self) -> Iterator[Any]:
        """The second pass: each record's plan, in input order, one at a time."""
        try:
            lines = _content_lines(self.fh)
            if self.header:
                next(lines)
            for i, line in enumerate(lines):
                # the reader of the first pass: a long line's integer lists again come as arrays
                yield make_plan(call_from_record(loads_document(line), f"calls[{i}]"), self.gpu, self.kernel)
        finally:
            self.close()


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest
