"""SGLang crash dumps (``--crash-dump-folder``): pickles of ``{"server_args", "requests", "launch_command"}``.

Loading a pickle runs whatever callables it names, so an untrusted dump is read with
:class:`RestrictedUnpickler`, which imports nothing and calls nothing from the file:

* every global the pickle names becomes an inert stand-in class (:class:`StandIn` subclass) that only
  records its module, name, constructor arguments and state; globals from modules that can run
  code or touch the system (``os``, ``subprocess``, ``builtins.eval``, ``importlib``...) are refused
  outright with :class:`UnsafePickleError`;
* REDUCE / NEWOBJ / BUILD only ever reach stand-ins (or a handful of the loader's own constructors
  for plain containers such as ``set`` and ``OrderedDict``), and their arguments and state must be
  plain data (None, bool, int, float, complex, str, bytes, list, tuple, dict, set) or stand-ins;
  anything else is refused;
* persistent ids are refused.

``trust=True`` (``--trust-pickle``) uses the standard loader, for files the user produced.

What the dump holds (SGLang's tokenizer manager writes it on a crash): ``server_args`` is the
``ServerArgs`` dataclass (or None when it failed to pickle; from 0.5.23 a msgspec Struct pickled
through ``__reduce__`` as a rebuild function's ``(class, fields, bookkeeping)``, next to a
``resolved_config`` dict of the resolved values, srt/managers/tokenizer_manager.py:3363-3368 and
srt/server_args.py:498-505), ``requests`` a list of tuples
``(GenerateReqInput, output dict, created time, finished time)`` for requests finished in the last
5 minutes and those still unfinished, ``launch_command`` the server's ``sys.argv`` joined by spaces.
"""
from __future__ import annotations

import io
import pickle
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..facts import limits
from ..errors import InputError
from ..facts.limits import echo

MAX_DUMP_BYTES = 512 * 1024 * 1024
MAX_PLAIN_DEPTH = 200

# Modules whose globals are refused outright: they run code, spawn processes or touch the system.
DENIED_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "sys", "builtins", "__builtin__", "__builtins__", "importlib", "imp",
    "runpy", "shutil", "socket", "ctypes", "pickle", "_pickle", "cPickle", "copy_reg", "marshal", "types",
    "code", "codeop", "pty", "multiprocessing", "signal", "io", "_io", "tempfile", "pathlib", "webbrowser",
    "asyncio", "threading", "_thread", "operator", "functools", "inspect", "gc", "site", "pydoc",
    "platform", "urllib", "http", "ftplib", "smtplib", "commands", "popen2", "posixpath", "ntpath",
    "shelve", "dbm", "sqlite3", "ssl", "select", "selectors", "mmap", "resource", "fcntl", "termios",
    "ast", "dis", "compileall", "py_compile", "zipimport", "pkgutil", "timeit", "trace", "bdb", "pdb",
    "cProfile", "profile", "distutils", "setuptools", "pip", "venv", "glob", "fileinput", "logging",
    "codecs", "zipfile", "tarfile", "gzip", "bz2", "lzma", "requests", "yaml", "dill", "cloudpickle",
    "joblib", "torch._C", "numpy.ctypeslib", "sysconfig", "atexit", "weakref", "contextlib", "abc",
})
# Safe builtins kept as inert stand-ins (so they can appear as arguments, e.g. defaultdict(list)).
INERT_BUILTINS = frozenset({"object", "list", "dict", "tuple", "str", "int", "float", "bool", "bytes",
                            "complex", "slice", "range", "NoneType", "Ellipsis", "NotImplemented"})


class UnsafePickleError(InputError):
    """The pickle asks for something the restricted loader will not do."""

    def __init__(self, message: str):
        super().__init__("crash dump", message)


class StandIn:
    """Base of the inert classes that replace every global named by an untrusted pickle."""

    _pickled_module = ""
    _pickled_name = ""

    def __new__(cls, *args, **kwargs):
        if cls is StandIn:
            raise UnsafePickleError("the base stand-in class cannot be instantiated from a pickle")
        obj = object.__new__(cls)
        obj.__dict__["_args"] = _check_plain(args, f"arguments of {cls.qualified()}")
        obj.__dict__["_kwargs"] = _check_plain(dict(kwargs), f"keyword arguments of {cls.qualified()}")
        obj.__dict__["_state"] = None
        obj.__dict__["_items"] = []
        obj.__dict__["_setitems"] = {}
        return obj

    def __init__(self, *args, **kwargs):   # REDUCE calls the class: nothing more to do
        pass

    def __setstate__(self, state):
        self.__dict__["_state"] = _check_plain(state, f"state of {type(self).qualified()}")

    # APPEND / APPENDS / SETITEMS on objects that pickled as list or dict subclasses
    def append(self, item):
        self.__dict__["_items"].append(_check_plain(item, f"items of {type(self).qualified()}"))

    def extend(self, items):
        for it in items:
            self.append(it)

    def __setitem__(self, key, value):
        self.__dict__["_setitems"][_check_plain(key, "key")] = _check_plain(value, f"items of {type(self).qualified()}")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        st = self.__dict__.get("_state")
        if isinstance(st, dict) and name in st:
            return st[name]
        if isinstance(st, tuple) and len(st) == 2 and isinstance(st[1], dict) and name in st[1]:
            return st[1][name]
        raise AttributeError(name)

    @classmethod
    def qualified(cls) -> str:
        return f"{cls._pickled_module}.{cls._pickled_name}"

    @property
    def state(self) -> Any:
        return self.__dict__.get("_state")

    @property
    def args(self) -> tuple:
        return self.__dict__.get("_args", ())

    def fields(self) -> dict:
        """The object's attributes as recorded (dataclass ``__dict__`` state, slots, or set items; for
        an object pickled through a rebuild function called as ``f(cls, fields, extra)``, such as
        SGLang 0.5.23's ``ServerArgs.__reduce__``, the ``fields`` mapping)."""
        st = self.state
        out: dict = {}
        args = self.args
        if (len(args) >= 2 and isinstance(args[0], type) and issubclass(args[0], StandIn)
                and isinstance(args[1], dict) and all(isinstance(k, str) for k in args[1])):
            out.update(args[1])
        if isinstance(st, dict):
            out.update(st)
        elif isinstance(st, tuple) and len(st) == 2:
            for part in st:
                if isinstance(part, dict):
                    out.update(part)
        out.update(self.__dict__.get("_setitems", {}))
        return out

    def __repr__(self) -> str:
        return f"<stand-in {self.qualified()} args={echo(self.args)} state={'set' if self.state is not None else 'none'}>"


def _check_plain(x: Any, what: str, depth: int = 0, seen: set | None = None) -> Any:
    """Return ``x`` if it is plain data or stand-ins all the way down; refuse anything else."""
    if depth > MAX_PLAIN_DEPTH:
        raise UnsafePickleError(f"{what}: nested deeper than {MAX_PLAIN_DEPTH}")
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes, bytearray)):
        return x
    if isinstance(x, StandIn) or (isinstance(x, type) and issubclass(x, StandIn) and x is not StandIn):
        return x
    if isinstance(x, (list, tuple, dict, set, frozenset)):
        seen = seen if seen is not None else (_CHECKED[-1] if _CHECKED else set())
        if id(x) in seen:
            return x
        if isinstance(seen, _Seen):
            seen[id(x)] = x
        else:
            seen.add(id(x))
        items = list(x.items()) if isinstance(x, dict) else [(None, v) for v in x]
        for k, v in items:
            if k is not None:
                _check_plain(k, what, depth + 1, seen)
            _check_plain(v, what, depth + 1, seen)
        return x
    raise UnsafePickleError(f"{what}: refused a {type(x).__name__} object (only plain data and stand-ins are rebuilt)")


# The loader's own constructors for containers that pickles build through REDUCE.
def _safe_set(items=()):
    return set(_check_plain(list(items), "set items"))


def _safe_frozenset(items=()):
    return frozenset(_check_plain(list(items), "frozenset items"))


def _safe_bytearray(data=b"", *rest):
    if isinstance(data, str) and rest:
        return bytearray(data.encode("latin-1"))
    if not isinstance(data, (bytes, bytearray)):
        raise UnsafePickleError(f"bytearray from {type(data).__name__} refused")
    return bytearray(data)


def _safe_encode(text="", encoding="latin1"):
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError("_codecs.encode is only accepted for latin-1 strings (protocol-2 bytes)")
    return text.encode("latin-1")


def _safe_ordered_dict(items=()):
    return dict(_check_plain(list(items), "OrderedDict items"))


def _safe_deque(items=(), maxlen=None):
    return list(_check_plain(list(items), "deque items"))


def _safe_reconstructor(cls, base, state):
    if not (isinstance(cls, type) and issubclass(cls, StandIn) and cls is not StandIn):
        raise UnsafePickleError("copyreg._reconstructor is only accepted for stand-in classes")
    obj = cls.__new__(cls)
    if state is not None:
        obj.__dict__["_args"] = (_check_plain(state, "reconstructor state"),)
    return obj


def _safe_newobj(cls, *args):
    if not (isinstance(cls, type) and issubclass(cls, StandIn) and cls is not StandIn):
        raise UnsafePickleError("copyreg.__newobj__ is only accepted for stand-in classes")
    return cls.__new__(cls, *args)


SAFE_CALLABLES = {
    ("builtins", "set"): _safe_set, ("__builtin__", "set"): _safe_set,
    ("builtins", "frozenset"): _safe_frozenset, ("__builtin__", "frozenset"): _safe_frozenset,
    ("builtins", "bytearray"): _safe_bytearray, ("__builtin__", "bytearray"): _safe_bytearray,
    ("_codecs", "encode"): _safe_encode,
    ("collections", "OrderedDict"): _safe_ordered_dict,
    ("collections", "deque"): _safe_deque,
    ("copyreg", "_reconstructor"): _safe_reconstructor, ("copy_reg", "_reconstructor"): _safe_reconstructor,
    ("copyreg", "__newobj__"): _safe_newobj, ("copy_reg", "__newobj__"): _safe_newobj,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that replaces every global with an inert stand-in (or refuses it). See the module doc."""

    def __init__(self, file, **kwargs):
        super().__init__(file, **kwargs)
        self._file = file
        self._classes: dict[tuple[str, str], type] = {}
        self.globals_seen: list[str] = []

    def _where(self) -> str:
        try:
            return f" (near byte {self._file.tell()})"
        except Exception:  # pragma: no cover - a file without tell()
            return ""

    def find_class(self, module: str, name: str):
        qual = f"{module}.{name}"
        if len(self.globals_seen) < 1000 and qual not in self.globals_seen:
            self.globals_seen.append(qual)
        safe = SAFE_CALLABLES.get((module, name))
        if safe is not None:
            return safe
        root = module.split(".")[0]
        if module in ("builtins", "__builtin__") and name in INERT_BUILTINS:
            pass
        elif module in DENIED_MODULES or root in DENIED_MODULES or module == "copyreg":
            raise UnsafePickleError(f"refused to load global {qual}{self._where()}: the dump asks for a callable "
                                    "that can run code or touch the system; nothing was executed")
        if not name or not all(part.isidentifier() for part in name.split(".")) or not all(
                part.isidentifier() for part in module.split(".")):
            raise UnsafePickleError(f"refused a malformed global name {echo(qual)}{self._where()}")
        key = (module, name)
        cls = self._classes.get(key)
        if cls is None:
            cls = type(name.split(".")[-1], (StandIn,), {"_pickled_module": module, "_pickled_name": name,
                                                         "__module__": __name__})
            self._classes[key] = cls
        return cls

    def persistent_load(self, pid):
        raise UnsafePickleError(f"refused a persistent id{self._where()}: crash dumps do not use them")


def restricted_loads(data: bytes) -> Any:
    """Unpickle ``data`` without importing or calling anything it names."""
    bio = io.BytesIO(data)
    try:
        with _checked_once():
            obj = RestrictedUnpickler(bio).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, OverflowError, MemoryError, RecursionError, UnicodeDecodeError) as e:
        raise InputError("crash dump", f"not a readable pickle (near byte {bio.tell()}): "
                         f"{type(e).__name__}: {echo(str(e))}") from None
    limits.check_tree(obj, "crash dump", max_nodes=limits.MAX_DUMP_NODES, children=_standin_parts)
    return obj


def _standin_parts(x: Any) -> tuple | None:
    if isinstance(x, StandIn):
        d = x.__dict__
        return (d.get("_args"), d.get("_kwargs"), d.get("_state"), d.get("_items"), d.get("_setitems"))
    if isinstance(x, (set, frozenset)):
        return tuple(x)
    return None


class _Seen(dict):
    """Containers already checked during one load, by id (the values keep them alive so that their
    ids stay theirs)."""


_CHECKED: list[_Seen] = []   # containers already checked by _check_plain during the current load


@contextmanager
def _checked_once():
    _CHECKED.append(_Seen())
    try:
        yield
    finally:
        _CHECKED.pop()


def load_pickle(path: str, trust: bool = False) -> Any:
    p = Path(path)
    if not p.is_file():
        raise InputError("--dump", f"{path}: no such file")
    size = p.stat().st_size
    if size > MAX_DUMP_BYTES:
        raise InputError("--dump", f"{path}: {size} bytes is larger than {MAX_DUMP_BYTES}")
    data = p.read_bytes()
    if not trust:
        return restricted_loads(data)
    try:
        return pickle.loads(data)  # noqa: S301 - explicit opt-in (--trust-pickle) for the user's own files
    except ModuleNotFoundError as e:
        raise InputError("--trust-pickle", f"the dump needs module {echo(e.name)} installed to load it trusted; "
                         "drop --trust-pickle to read it with the restricted loader") from None
    except Exception as e:
        raise InputError("crash dump", f"not a readable pickle: {type(e).__name__}: {e}") from None


# ------------------------------------------------------------------------------ interpretation
def attrs(obj: Any) -> dict:
    """Attributes of a dump object, whether a stand-in, a dict or (trusted loading) the real object."""
    if isinstance(obj, StandIn):
        return obj.fields()
    if isinstance(obj, dict):
        return obj
    struct_fields = getattr(type(obj), "__struct_fields__", None)   # a msgspec Struct (trusted loading)
    if struct_fields is not None:
        return {f: getattr(obj, f, None) for f in struct_fields}
    d = getattr(obj, "__dict__", None)
    return dict(d) if isinstance(d, dict) else {}


def plain_value(v: Any) -> Any:
    """Enum stand-ins (``DisaggregationMode('decode')``) -> their value; other objects -> their name."""
    if isinstance(v, StandIn):
        if len(v.args) == 1 and isinstance(v.args[0], (str, int, float, bool)):
            return v.args[0]
        if isinstance(v.state, (str, int, float)):
            return v.state
        return v.qualified()
    if isinstance(v, type) and issubclass(v, StandIn):
        return v.qualified()
    if hasattr(v, "value") and type(v).__module__ != "builtins" and isinstance(getattr(v, "value"), (str, int)):
        return v.value   # a real enum (trusted loading)
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return [plain_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain_value(x) for k, x in v.items()}
    return repr(v)[:200]


@dataclass
class DumpRequest:
    rid: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    finished: bool
    created: float | None
    finished_time: float | None

    def to_dict(self) -> dict:
        return {"rid": self.rid, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "finished": self.finished}


@dataclass
class CrashDump:
    path: str
    server_args: dict
    launch_command: str | None
    requests: list[DumpRequest]
    globals_seen: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def unfinished(self) -> list[DumpRequest]:
        return [r for r in self.requests if not r.finished]

    def to_dict(self) -> dict:
        return {"path": self.path, "launch_command": self.launch_command,
                "num_requests": len(self.requests), "num_unfinished": len(self.unfinished),
                "unfinished": [r.to_dict() for r in self.unfinished[:50]],
                "globals": self.globals_seen[:50], "notes": list(self.notes)}


def _num(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _request_entries(entry: Any, idx: int, notes: list[str]) -> list[DumpRequest]:
    if not isinstance(entry, (tuple, list)) or not entry:
        notes.append(f"requests[{idx}]: not a (request, output, created, finished) tuple; skipped")
        return []
    obj = attrs(entry[0])
    out = attrs(entry[1]) if len(entry) > 1 else {}
    created = entry[2] if len(entry) > 2 and isinstance(entry[2], (int, float)) else None
    fin_t = entry[3] if len(entry) > 3 and isinstance(entry[3], (int, float)) else None
    meta = out.get("meta_info") if isinstance(out.get("meta_info"), dict) else {}
    rid = obj.get("rid", meta.get("id"))
    input_ids = obj.get("input_ids")
    prompt = _num(meta.get("prompt_tokens"))
    if prompt is None and isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], int):
        prompt = len(input_ids)
    finished = meta.get("finish_reason") is not None
    if isinstance(rid, list):  # a batched GenerateReqInput: one entry per sub-request
        return [DumpRequest(str(r), None, None, None, finished, created, fin_t) for r in rid]
    return [DumpRequest(str(rid), prompt, _num(meta.get("completion_tokens")), _num(meta.get("cached_tokens")),
                        finished, created, fin_t)]


def read_crash_dump(path: str, trust: bool = False) -> CrashDump:
    """Load and interpret an SGLang crash dump. Raises :class:`InputError` (or :class:`UnsafePickleError`)."""
    if trust:
        top = load_pickle(path, trust=True)
        seen: list[str] = []
    else:
        p = Path(path)
        if not p.is_file():
            raise InputError("--dump", f"{path}: no such file")
        if p.stat().st_size > MAX_DUMP_BYTES:
            raise InputError("--dump", f"{path}: larger than {MAX_DUMP_BYTES} bytes")
        bio = io.BytesIO(p.read_bytes())
        up = RestrictedUnpickler(bio)
        try:
            with _checked_once():
                top = up.load()
        except UnsafePickleError:
            raise
        except Exception as e:
            raise InputError("crash dump", f"{path}: not a readable pickle (near byte {bio.tell()}): "
                             f"{type(e).__name__}: {echo(str(e))}") from None
        limits.check_tree(top, "crash dump", max_nodes=limits.MAX_DUMP_NODES, children=_standin_parts)
        seen = up.globals_seen
    if not isinstance(top, dict):
        raise InputError("crash dump", f"{path}: expected a dict with server_args / requests / launch_command, "
                         f"got {type(top).__name__}")
    notes: list[str] = []
    sa_obj = top.get("server_args")
    server_args = {k: plain_value(v) for k, v in attrs(sa_obj).items()} if sa_obj is not None else {}
    resolved = top.get("resolved_config")
    if isinstance(resolved, dict):
        # SGLang 0.5.23: the configuration in effect (resolved values), over the raw fields
        server_args.update({str(k): plain_value(v) for k, v in resolved.items() if isinstance(k, str)})
        notes.append("settings from resolved_config (the resolved values), over server_args")
    if sa_obj is None:
        notes.append("server_args is None in the dump (SGLang stores None when they fail to pickle)")
    if sa_obj is not None and not server_args:
        notes.append(f"server_args ({type(sa_obj).__name__}) holds no readable fields")
    reqs_raw = top.get("requests") or []
    if not isinstance(reqs_raw, list):
        raise InputError("crash dump.requests", f"expected a list, got {type(reqs_raw).__name__}")
    reqs: list[DumpRequest] = []
    for i, e in enumerate(reqs_raw):
        reqs.extend(_request_entries(e, i, notes))
    lc = top.get("launch_command")
    return CrashDump(path, server_args, lc if isinstance(lc, str) else None, reqs, seen, notes)
