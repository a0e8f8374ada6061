"""numpy, loaded where it is first used rather than where a module that may use it is imported.

A module that reads arrays says ``np = numpy_on_first_use(globals())``: the name ``np`` then stands
for numpy until it is first read (``np.asarray``, ``np.ndarray``), which imports numpy and puts it
in that module's namespace in place of the stand-in, so every later use is a plain global lookup.
A command that builds no schedule and reads no column as an array (``validate-batch rules``,
``--help``, ``gpus``) then never pays numpy's import.
"""
from __future__ import annotations


class _Deferred:
    __slots__ = ("_namespace",)

    def __init__(self, namespace: dict):
        self._namespace = namespace

    def __getattr__(self, name: str):
        import numpy

        self._namespace["np"] = numpy
        return getattr(numpy, name)

    def __repr__(self) -> str:
        return "<numpy, imported on first use>"


def numpy_on_first_use(namespace: dict):
    """A stand-in for numpy in ``namespace`` (a module's ``globals()``), bound to the name ``np``."""
    return _Deferred(namespace)
