"""Glue between input documents and reports, shared by the CLI commands."""
from __future__ import annotations

from typing import Optional

from ..api import check_calls
from ..inputs.batch import is_batch_document
from ..errors import InputError
from ..inputs.documents import is_device_header, load_documents
from ..facts.knowledge import GPU, gpu_from_fields, resolve_gpu
from ..legality.pipeline import check_batch_document
from ..legality.report import CallsContext, Report


def split_device_header(docs: list, gpu_opt: Optional[str]) -> tuple[list, GPU]:
    """Peel an optional device header off call records; ``--gpu`` overrides it; H200 by default."""
    gpu = None
    if docs and is_device_header(docs[0]):
        gpu = gpu_from_fields(docs[0], "device header")
        docs = docs[1:]
    if gpu_opt:
        gpu = resolve_gpu(gpu_opt)
    return docs, gpu or resolve_gpu("H200")


def check_documents(path: str, gpu: Optional[str], build: Optional[str],
                    engine: Optional[str] = None, as_written: bool = False) -> tuple[Report, dict]:
    """Read FILE and check it: either call records (oracle format) or one engine batch (``engine``:
    the profile of a batch that names none, from ``[tool.validate-batch]`` or the environment)."""
    docs = load_documents(path)
    if len(docs) == 1 and is_batch_document(docs[0]):
        doc = docs[0]
        if engine is not None and "engine" not in doc and "profile" not in doc:
            doc = {**doc, "engine": engine}
        if as_written:
            doc = {**doc, "as_written": True}
        return check_batch_document(doc, gpu=gpu, build=build)
    if any(is_batch_document(d) for d in docs):
        raise InputError("FILE", "one engine batch per file (or a list of call records), not a mix")
    docs, g = split_device_header(docs, gpu)
    if not docs:
        raise InputError("FILE", "no call records")
    report = check_calls(docs, g, build)
    report.context = CallsContext(report.plans[0].gpu.to_dict() if report.plans else None,
                                  [p.to_dict(with_schedule=False) for p in report.plans])
    return report, report.context
