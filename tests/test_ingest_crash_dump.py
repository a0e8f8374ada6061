"""SGLang crash dumps: the restricted loader runs nothing from the file; real dumps are still read.

The dump format (tokenizer manager, ``dump_requests_before_crash``): a pickled dict with
``server_args`` (the ServerArgs dataclass), ``requests`` (tuples of the request object, its last
output dict, created and finished times) and ``launch_command`` (``" ".join(sys.argv)``). Fake
stand-ins for SGLang's classes are registered under SGLang's module names only while pickling.
"""
from __future__ import annotations

import enum
import os
import pickle
import subprocess
import sys
import types
from dataclasses import dataclass, field

import pytest

from validate_batch.errors import InputError
from validate_batch.ingest.crash_dump import (
    RestrictedUnpickler,
    StandIn,
    UnsafePickleError,
    read_crash_dump,
    restricted_loads,
)


# ----------------------------------------------------------------------------- malicious pickles
def _str(text: str) -> bytes:
    """SHORT_BINUNICODE opcode for ``text``."""
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b


class _Reduce:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _evil_payloads(marker: str) -> dict[str, bytes]:
    cmd = f"touch {marker}"
    return {
        "os.system": pickle.dumps(_Reduce(os.system, (cmd,))),
        "builtins.eval": pickle.dumps(_Reduce(eval, (f"__import__('os').system({cmd!r})",))),
        "builtins.exec": pickle.dumps(_Reduce(exec, (f"open({marker!r}, 'w').close()",))),
        "subprocess.Popen": pickle.dumps(_Reduce(subprocess.Popen, (["touch", marker],))),
        "subprocess.call in server_args": pickle.dumps(
            {"server_args": _Reduce(subprocess.call, (["touch", marker],)), "requests": [], "launch_command": "x"}),
        "protocol 0 GLOBAL": f"cos\nsystem\n(S'{cmd}'\ntR.".encode(),
        "protocol 0 INST": f"(S'{cmd}'\nios\nsystem\n.".encode(),
        "getattr chain": pickle.dumps(_Reduce(getattr, (_Reduce(__import__, ("os",)), "system"))),
        "importlib": pickle.dumps(_Reduce(__import__("importlib").import_module, ("os",))),
        "persistent id": b"\x80\x02P0\n.",
    }


@pytest.mark.parametrize("name", list(_evil_payloads("m").keys()))
def test_malicious_pickles_run_nothing(tmp_path, name):
    marker = tmp_path / "PWNED"
    data = _evil_payloads(str(marker))[name]
    with pytest.raises(UnsafePickleError) as ei:
        restricted_loads(data)
    assert "refused" in str(ei.value)
    assert not marker.exists()


def test_malicious_dump_through_the_cli_exits_2_and_runs_nothing(tmp_path):
    from typer.testing import CliRunner

    from validate_batch.cli.main import app

    marker = tmp_path / "PWNED"
    p = tmp_path / "crash_dump.pkl"
    p.write_bytes(pickle.dumps({"server_args": _Reduce(os.system, (f"touch {marker}",)), "requests": []}))
    r = CliRunner().invoke(app, ["bisect", "--dump", str(p)])
    assert r.exit_code == 2
    assert "refused to load global posix.system" in r.output or "refused to load global os.system" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not marker.exists()


def test_unknown_globals_become_inert_and_are_never_imported(tmp_path):
    # A module that would write the marker if it were ever imported.
    pkg = tmp_path / "boobytrap_pkg"
    pkg.mkdir()
    marker = tmp_path / "IMPORTED"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Thing:\n    pass\n")
    data = b"\x80\x04" + _str("boobytrap_pkg") + _str("Thing") + b"\x93" + _str("hello") + b"\x85R."  # Thing("hello")
    sys.path.insert(0, str(tmp_path))
    try:
        obj = restricted_loads(data)
    finally:
        sys.path.remove(str(tmp_path))
    assert isinstance(obj, StandIn)
    assert type(obj).qualified() == "boobytrap_pkg.Thing" and obj.args == ("hello",)
    assert "boobytrap_pkg" not in sys.modules and not marker.exists()


def test_refused_state_and_args_that_are_not_plain_data():
    # A stand-in may only be rebuilt from plain data: a callable smuggled in as an argument is refused.
    data = (b"\x80\x04" + _str("mod1") + _str("A") + b"\x93"                 # mod1.A
            + _str("collections") + _str("deque") + b"\x93"               # collections.deque (the loader's own)
            + b"\x85R.")                                                    # A(deque) -> refused
    with pytest.raises(UnsafePickleError, match="refused a function"):
        restricted_loads(data)


def test_not_a_pickle_is_a_clear_input_error(tmp_path):
    with pytest.raises(InputError, match="not a readable pickle"):
        restricted_loads(b"\x80\x04garbage")
    p = tmp_path / "empty.pkl"
    p.write_bytes(b"")
    with pytest.raises(InputError, match="not a readable pickle"):
        read_crash_dump(str(p))
    with pytest.raises(InputError, match="no such file"):
        read_crash_dump(str(tmp_path / "missing.pkl"))


# ----------------------------------------------------------------------------- a realistic dump
class DisaggregationMode(enum.Enum):
    __module__ = "sglang.srt.disaggregation.utils"
    NULL = "null"
    DECODE = "decode"


@dataclass
class ServerArgs:
    model_path: str = "deepseek-ai/DeepSeek-V4-Flash"
    tp_size: int = 8
    dp_size: int = 1
    chunked_prefill_size: int = 16384
    max_prefill_tokens: int = 16384
    max_running_requests: int = 64
    enable_mixed_chunk: bool = False
    disaggregation_mode: DisaggregationMode = DisaggregationMode.NULL
    cuda_graph_bs: list = field(default_factory=lambda: [1, 2, 4])


@dataclass
class GenerateReqInput:
    text: str = ""
    input_ids: list | None = None
    sampling_params: dict = field(default_factory=dict)
    rid: str = ""


# Pickles name these classes by SGLang's module paths.
ServerArgs.__module__ = "sglang.srt.server_args"
GenerateReqInput.__module__ = "sglang.srt.managers.io_struct"


def _register_fake_sglang(monkeypatch):
    mods = {}
    for name in ("sglang", "sglang.srt", "sglang.srt.server_args", "sglang.srt.managers", "sglang.srt.managers.io_struct",
                 "sglang.srt.disaggregation", "sglang.srt.disaggregation.utils"):
        mods[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, mods[name])
    for cls in (ServerArgs, GenerateReqInput, DisaggregationMode):
        setattr(mods[cls.__module__], cls.__name__, cls)


def _make_dump(path, monkeypatch, protocol=pickle.DEFAULT_PROTOCOL):
    _register_fake_sglang(monkeypatch)
    sa = ServerArgs(disaggregation_mode=DisaggregationMode.DECODE)
    reqs = [
        (GenerateReqInput(text="hi", rid="done-1"), {"text": "x", "meta_info": {"id": "done-1", "prompt_tokens": 700,
                                                                                 "completion_tokens": 30, "cached_tokens": 0,
                                                                                 "finish_reason": {"type": "stop"}}}, 1.0, 2.0),
        (GenerateReqInput(input_ids=list(range(4096)), rid="wait-1"), {}, 3.0, 4.0),
        (GenerateReqInput(text="t", rid="wait-2"), {"meta_info": {"id": "wait-2", "prompt_tokens": 4096,
                                                                  "completion_tokens": 0, "cached_tokens": 0,
                                                                  "finish_reason": None}}, 3.0, 4.0),
        (GenerateReqInput(text="t", rid="run-1"), {"meta_info": {"id": "run-1", "prompt_tokens": 1800,
                                                                 "completion_tokens": 45, "cached_tokens": 0,
                                                                 "finish_reason": None}}, 3.0, 4.0),
    ]
    data = {"server_args": sa, "requests": reqs,
            "launch_command": "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V4-Flash --tp 8"}
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_realistic_dump_read_without_importing_anything(tmp_path, monkeypatch, protocol):
    p = _make_dump(tmp_path / "crash_dump_2026-04-28_10-12-05.pkl", monkeypatch, protocol)
    monkeypatch.delitem(sys.modules, "sglang.srt.server_args")   # the loader must not need SGLang
    d = read_crash_dump(str(p))
    assert d.server_args["chunked_prefill_size"] == 16384 and d.server_args["tp_size"] == 8
    assert d.server_args["disaggregation_mode"] == "decode"       # enum stand-in -> its value
    assert d.server_args["cuda_graph_bs"] == [1, 2, 4]
    assert d.launch_command.startswith("python3 -m sglang.launch_server")
    by = {r.rid: r for r in d.requests}
    assert by["done-1"].finished and not by["wait-1"].finished
    assert by["wait-1"].prompt_tokens == 4096 and by["wait-2"].prompt_tokens == 4096
    assert by["run-1"].completion_tokens == 45
    assert "sglang.srt.server_args.ServerArgs" in d.globals_seen


def test_trusted_loading_gives_the_same_interpretation(tmp_path, monkeypatch):
    p = _make_dump(tmp_path / "d.pkl", monkeypatch)
    d = read_crash_dump(str(p), trust=True)
    assert d.server_args["chunked_prefill_size"] == 16384 and d.server_args["disaggregation_mode"] == "decode"
    assert len(d.unfinished) == 3


def test_trusted_loading_without_the_classes_says_what_to_do(tmp_path, monkeypatch):
    p = _make_dump(tmp_path / "d.pkl", monkeypatch)
    for name in ("sglang.srt.server_args", "sglang.srt", "sglang"):
        monkeypatch.setitem(sys.modules, name, None)    # not importable, even where the real wheel is installed
    with pytest.raises(InputError, match="drop --trust-pickle"):
        read_crash_dump(str(p), trust=True)


def test_unpickler_records_the_globals_it_was_asked_for():
    import io

    # a.b.C.__new__(C) then BUILD with {"x": 5}
    up = RestrictedUnpickler(io.BytesIO(b"\x80\x04" + _str("a.b") + _str("C") + b"\x93)\x81}" + _str("x") + b"K\x05sb."))
    obj = up.load()
    assert up.globals_seen == ["a.b.C"] and obj.fields() == {"x": 5}
