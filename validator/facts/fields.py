"""Field validation, in one place: integers in documents, per-request integer columns, counts.

Every check raises :class:`~validate_batch.errors.InputError` naming the field (a dotted path, with the
element index for a column: ``extend_lens[3]``). The column checks run at C speed for lists of
plain ints and integer arrays; :mod:`validate_batch._accel` supplies a compiled pass when it is built.
"""
from __future__ import annotations

from typing import Any, Mapping

from .. import _accel
from ..errors import InputError
from .limits import echo
from .._numpy import numpy_on_first_use

np = numpy_on_first_use(globals())

MAX_REQUESTS = 1 << 20       # requests in one forward
MAX_TOKENS = 1 << 24         # new tokens of one request
MAX_POSITION = (1 << 31) - 1  # a sequence length, prefix or slot (int32, as the engines and the call records hold them)
_INT_TYPES = frozenset({int})


def min_max(a: np.ndarray) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer array as Python ints (the ufunc reductions directly:
    ``ndarray.min`` goes through a Python-level wrapper first, which shows on every step; a few
    values are cheaper still as a list)."""
    if a.ndim == 1 and a.shape[0] <= 16:
        v = a.tolist()
        return min(v), max(v)
    return int(np.minimum.reduce(a)), int(np.maximum.reduce(a))


def is_int(x) -> bool:
    """A plain or numpy integer (booleans are not integers here)."""
    return (type(x) is int) or (isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)))


def bad_element(v, ok) -> int:
    """Index of the first element of ``v`` that ``ok`` rejects."""
    return next(i for i, x in enumerate(v) if not ok(x))


def field_name(where: str, key: str) -> str:
    """``where.key`` (or ``key`` at the top level)."""
    return f"{where}.{key}" if where else key


def int_field(d: Mapping, key: str, where: str, lo: int, hi: int, default: Any = ...) -> Any:
    """``d[key]`` as an integer in ``lo..hi`` (numpy integers too); ``default`` when absent or None
    (``...``: required)."""
    v = d.get(key)
    if v.__class__ is int and lo <= v <= hi:     # the common cases, with no intermediate objects
        return v
    if v is None and default is not ...:
        return default
    name = field_name(where, key)
    if key not in d or d[key] is None:
        if default is ...:
            raise InputError(name, "missing")
        return default
    v = d[key]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise InputError(name, f"expected an integer, got {echo(v)}")
    v = int(v)
    if v < lo:
        raise InputError(name, f"expected >= {lo}, got {echo(v)}")
    if v > hi:
        raise InputError(name, f"{echo(v)} is absurd (expected <= {hi})")
    return v


def bool_field(d: Mapping, key: str, where: str, default: bool) -> bool:
    """``d[key]`` as true or false (``default`` when absent)."""
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise InputError(field_name(where, key), f"expected true or false, got {echo(v)}")
    return v


def int_arg(v: Any, name: str, lo: int, hi: int) -> int:
    """A keyword argument that must be an integer in ``lo..hi``."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InputError(name, f"expected an integer, got {echo(v)}")
    v = int(v)
    if not lo <= v <= hi:
        raise InputError(name, f"expected {lo}..{hi}, got {echo(v)}")
    return v


def non_negative_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(name, f"expected a non-negative integer, got {echo(v)}")
    return v


def positive_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise InputError(name, f"expected a positive integer, got {echo(v)}")
    return v


def total(v) -> int:
    """Sum of a validated column (list or array)."""
    return int(v.sum()) if isinstance(v, np.ndarray) else sum(v)


def count(v) -> int:
    """Length of a validated column (list or array)."""
    return int(v.shape[0]) if isinstance(v, np.ndarray) else len(v)


def top(v) -> int | None:
    """Largest value of a validated column (None when empty or absent)."""
    if v is None or not count(v):
        return None
    return int(v.max()) if isinstance(v, np.ndarray) else max(v)


def top_within(v: list, lo: int, hi: int) -> int:
    """The largest value of a non-empty list of plain ints all in [lo, hi] (lo >= 0), or -1 when it
    is not one: :func:`ints_within` that also gives the maximum, in the same pass for short lists
    (and for long ones with the compiled helpers)."""
    if len(v) <= 8:
        best = -1
        for x in v:
            if x.__class__ is not int or x < lo or x > hi:
                return -1
            if x > best:
                best = x
        return best
    c = _accel.compiled
    if c is not None:
        st = c.int_stats(v, lo, hi)
        return -1 if st is None else st[0]
    if set(map(type, v)) != _INT_TYPES or min(v) < lo:
        return -1
    best = max(v)
    return best if best <= hi else -1


def ints_within(v: list, lo: int, hi: int) -> bool:
    """A list of plain ints, all in [lo, hi] (an element loop for short lists; for long ones one
    compiled pass, or C builtins without the compiled helpers).

    The same pass as :func:`top_within` without the maximum, kept as its own loop: calling that one
    costs about 0.1 us more per list, a measurable part of the verdict on one-request steps."""
    if len(v) <= 8:
        for x in v:
            if x.__class__ is not int or x < lo or x > hi:
                return False
        return True
    c = _accel.compiled
    if c is not None:
        return c.int_stats(v, lo, hi) is not None
    return set(map(type, v)) == _INT_TYPES and min(v) >= lo and max(v) <= hi


def sum_within(v: list, lo: int, hi: int) -> int:
    """The sum of a non-empty list of plain ints all in [lo, hi] (lo >= 0), or -1 when it is not
    one (:func:`ints_within` and the sum, in one compiled pass when the helpers are built)."""
    c = _accel.compiled
    if c is not None and len(v) > 8:
        st = c.int_stats(v, lo, hi)
        return -1 if st is None else st[1]
    return sum(v) if v and ints_within(v, lo, hi) else -1


SHORT_ARRAY = 512   # up to this many values a 1-D integer array is read as a list by the fast checks


def short_int_list(v: Any) -> list | None:
    """A 1-D integer numpy array of at most :data:`SHORT_ARRAY` values as a list of plain ints
    (``tolist``: one C call, cheaper for a short array than numpy's reductions); None otherwise,
    and for anything that is not such an array."""
    if v.__class__ is np.ndarray and v.ndim == 1 and v.shape[0] <= SHORT_ARRAY and v.dtype.kind in "iu":
        return v.tolist()
    return None


def list_column(v: Any, name: str, lo: int, hi: int, n: int | None) -> list | np.ndarray:
    """:func:`column` for the verdict's reading of a step: a list of plain ints, or a short integer
    array read as one (:func:`short_int_list`), is checked with one pass (:func:`ints_within`) and
    comes back as that list; anything else, and anything that pass rejects, goes through
    :func:`column`, which names the bad element or converts the column."""
    if v.__class__ is not list:
        short = short_int_list(v)
        if short is not None:
            v = short
    if v.__class__ is list and v and (n is None or len(v) == n) and ints_within(v, lo, hi):
        return v
    return column(v, name, lo, hi, n)


def list_column_sum(v: Any, name: str, lo: int, hi: int, n: int | None) -> tuple:
    """:func:`list_column` that also gives the column's sum, ``(column, sum)``, from the pass that
    checks the list (:func:`sum_within`; lo >= 0)."""
    if v.__class__ is not list:
        short = short_int_list(v)
        if short is not None:
            v = short
    if v.__class__ is list and v and (n is None or len(v) == n):
        t = sum_within(v, lo, hi)
        if t >= 0:
            return v, t
    v = column(v, name, lo, hi, n)
    return v, total(v)


def list_column_top(v: Any, name: str, lo: int, hi: int, n: int | None, low: int) -> tuple:
    """:func:`list_column` that also gives the column's largest value: ``(column, top)``, where
    ``top`` is -1 when a value lies below ``low`` (lo <= low): the pass that checks the list finds
    its maximum too (:func:`top_within`)."""
    if v.__class__ is not list:
        short = short_int_list(v)
        if short is not None:
            v = short
    if v.__class__ is list and v and (n is None or len(v) == n):
        t = top_within(v, low, hi)
        if t >= 0:
            return v, t
    v = column(v, name, lo, hi, n)
    if not count(v):
        return v, None
    mn, mx = min_max(v) if isinstance(v, np.ndarray) else (min(v), max(v))
    return v, (-1 if mn < low else mx)


def int_array_within(v: list, lo: int, hi: int) -> np.ndarray | None:
    """A non-empty list of plain ints all in [lo, hi] as an int64 array (one compiled pass, or a few
    C builtins); None for anything else."""
    if not v:
        return None
    c = _accel.compiled
    if c is not None:
        a = np.empty(len(v), dtype=np.int64)
        return a if c.int_column(v, lo, hi, a) < 0 else None
    try:        # numpy reads the list in C; its dtype and range decide (see column for the 0 / 1 case)
        a = np.array(v)
    except (ValueError, TypeError, OverflowError):
        return None
    if a.dtype != np.int64 or a.ndim != 1:
        return None
    mn, mx = min_max(a)
    if mn < lo or mx > hi or (mn <= 1 and set(map(type, v)) != _INT_TYPES):
        return None
    return a


def column_slow(v: list, name: str, lo: int, hi: int) -> list:
    """The element-wise check of :func:`column`, naming the first bad element."""
    if not all(map(is_int, v)):
        i = bad_element(v, is_int)
        raise InputError(f"{name}[{i}]", f"expected an integer, got {echo(v[i])}")
    v = [int(x) for x in v]
    if min(v) < lo or max(v) > hi:
        i = bad_element(v, lambda x: lo <= x <= hi)
        raise InputError(f"{name}[{i}]", f"expected {lo}..{hi}, got {v[i]}")
    return v


def column(v: Any, name: str, lo: int, hi: int, n: int | None, as_array: bool = False):
    """Validate one per-request integer column; return it as a list or a 1-D int64 array.

    Runs at C speed for lists of ints and integer arrays (type set, min, max); anything else that
    has ``tolist()`` (a torch tensor) is converted first. ``as_array``: a list of plain ints comes
    back as an int64 array instead (the compiled list check reads it once; without it numpy reads it
    and its min and max decide the range, and as ``True``/``False`` would read as 1/0 the element
    types are looked at only when the minimum is 0 or 1).
    """
    if type(v) is list:
        if n is not None and len(v) != n:
            raise InputError(name, f"expected {n} values (one per request), got {len(v)}")
        if not v:
            return v
        if as_array:
            c = _accel.compiled
            if c is not None:           # one pass in C: exact ints in range, copied into the array
                a = np.empty(len(v), dtype=np.int64)
                return a if c.int_column(v, lo, hi, a) < 0 else column_slow(v, name, lo, hi)
            try:
                a = np.array(v)
            except (ValueError, TypeError, OverflowError):  # ragged nesting and the like: named below
                return column_slow(v, name, lo, hi)
            if a.dtype == np.int64 and a.ndim == 1:
                mn, mx = min_max(a)
                if lo <= mn and mx <= hi and (mn > 1 or set(map(type, v)) == _INT_TYPES):
                    return a
            return column_slow(v, name, lo, hi)
        c = _accel.compiled
        if c is not None and lo >= 0 and c.int_stats(v, lo, hi) is not None:
            return v                    # (one compiled pass: plain ints in range)
        if set(map(type, v)) != _INT_TYPES or min(v) < lo or max(v) > hi:
            return column_slow(v, name, lo, hi)
        return v
    if type(v) is tuple:
        return column(list(v), name, lo, hi, n, as_array)
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "iu":
            raise InputError(name, f"expected a 1-D integer array, got dtype {v.dtype} shape {v.shape}")
        if n is not None and v.shape[0] != n:
            raise InputError(name, f"expected {n} values (one per request), got {v.shape[0]}")
        if v.shape[0]:
            mn, mx = min_max(v)
            if mn < lo or mx > hi:
                i = int(np.argmax((v < lo) | (v > hi)))
                raise InputError(f"{name}[{i}]", f"expected {lo}..{hi}, got {int(v[i])}")
        return v.astype(np.int64, copy=False)
    tolist = getattr(v, "tolist", None)
    if tolist is None or isinstance(v, (str, bytes, Mapping)):
        raise InputError(name, f"expected a list of integers, got {type(v).__name__}")
    v = tolist()
    if not isinstance(v, list):
        raise InputError(name, f"expected a 1-D sequence of integers, got {type(v).__name__}")
    return column(v, name, lo, hi, n, as_array)
