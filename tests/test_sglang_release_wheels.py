"""The per-release data of rules/engines.json (sglang-dsv4 ``releases``) and rules/flashmla.json
(the ``sglang-kernel-<version>`` builds), checked against the released wheels themselves.

Where the wheels come from: ``VALIDATE_BATCH_SGLANG_WHEELS``, one or more directories (separated by
``os.pathsep``) holding ``sglang-<release>-*.whl`` and ``sglang_kernel-<version>-*.whl`` as
``pip download --no-deps sglang==<release>`` / ``sglang-kernel==<version>`` leave them. A release or
kernel version whose wheel is not there skips, saying so. The engine's Python source is parsed
(``ast``), never imported; the kernel binary is read as bytes (its combine-kernel template
instantiations) and, where ``cuobjdump`` is found (``VALIDATE_BATCH_CUOBJDUMP`` or on ``PATH``),
disassembled for the CTA index registers the combine kernel reads.

vLLM's bundled FlashMLA builds are checked against vLLM's own files in tests/test_vllm_bundled_flashmla.py.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

from validate_batch.facts.knowledge import generation, load

BACKEND = "sglang/srt/layers/attention/deepseek_v4_backend.py"
ENVIRON = "sglang/srt/environ.py"
METADATA_PY = "sglang/srt/layers/attention/dsv4/metadata.py"
HOOK = "sglang/srt/arg_groups/deepseek_v4_hook.py"
EXEC_FIELDS = "sglang/srt/arg_groups/fields/exec_.py"
SWITCH = "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"


def _dirs() -> list[Path]:
    raw = os.environ.get("VALIDATE_BATCH_SGLANG_WHEELS", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


@lru_cache(maxsize=None)
def wheel(dist: str, version: str) -> Path | None:
    for d in _dirs():
        for f in sorted(d.glob(f"{dist}-{version}-*.whl")):
            return f
    return None


def need(dist: str, version: str) -> zipfile.ZipFile:
    w = wheel(dist, version)
    if w is None:
        where = os.environ.get("VALIDATE_BATCH_SGLANG_WHEELS") or "VALIDATE_BATCH_SGLANG_WHEELS unset"
        pytest.skip(f"no {dist}-{version} wheel in {where}")
    return zipfile.ZipFile(w)


def text(zf: zipfile.ZipFile, name: str) -> str | None:
    try:
        return zf.read(name).decode("utf-8")
    except KeyError:
        return None


def rows() -> list[dict]:
    return load("engines")["profiles"]["sglang-dsv4"]["releases"]


def entry(name: str) -> dict:
    return next(v for v in load("engines")["profiles"]["sglang-dsv4"]["versions"] if v["name"] == name)


def merged(row: dict) -> dict:
    from validate_batch.engines import resolve_version
    return resolve_version("sglang-dsv4", row["release"])


RELEASES = [r["release"] for r in rows()]


def _switch_conditions(tree: ast.AST) -> list[str]:
    """The outermost boolean expressions that read the switch (``SWITCH.get()``), as source text."""
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == SWITCH):
            top, cur = None, node
            while cur in parents:
                cur = parents[cur]
                if isinstance(cur, ast.BoolOp):
                    top = cur
                elif isinstance(cur, (ast.stmt,)):
                    break
            out.append(ast.unparse(top if top is not None else node))
    return out


def _cp_switch_off(tree: ast.AST) -> tuple[bool, list[str]]:
    """Whether validate_deepseek_v4_cp turns the switch off, and the model types it spares."""
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "validate_deepseek_v4_cp"), None)
    if fn is None:
        return False, []

    def visit(node, guards):
        for child in ast.iter_child_nodes(node):
            g = guards + [child.test] if isinstance(child, ast.If) else guards
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "set"
                    and isinstance(child.func.value, ast.Attribute) and child.func.value.attr == SWITCH):
                yield guards
            yield from visit(child, g)

    hits = list(visit(fn, []))
    if not hits:
        return False, []
    spared = set()
    for guards in hits:
        for t in guards:
            if isinstance(t, ast.Compare) and isinstance(t.ops[0], ast.NotEq):
                spared |= {c.value for c in t.comparators if isinstance(c, ast.Constant)}
    return True, sorted(spared)


@pytest.mark.parametrize("release", RELEASES)
def test_the_kernel_pins_are_the_wheels(release):
    zf = need("sglang", release)
    meta = text(zf, f"sglang-{release}.dist-info/METADATA")
    pins = re.findall(r"^Requires-Dist: ((?:sglang-kernel|sgl-flash-mla)==[^\s;]+)\s*$", meta, re.M)
    row = next(r for r in rows() if r["release"] == release)
    assert sorted(pins) == sorted(row["pins"])


@pytest.mark.parametrize("release", RELEASES)
def test_the_switch_default_and_the_threshold_are_the_wheels(release):
    zf = need("sglang", release)
    v = merged(next(r for r in rows() if r["release"] == release))
    env = re.search(rf"^\s*{SWITCH} = EnvBool\((True|False)\)", text(zf, ENVIRON), re.M)
    thr = re.search(r"^_LARGE_INDEXER_QUERY_THRESHOLD = (\d+)", text(zf, METADATA_PY) or "", re.M)
    if v.get("sparse_prefill_switch") is None:
        assert env is None and v.get("sparse_prefill_threshold") is None and thr is None
        assert not _switch_conditions(ast.parse(text(zf, BACKEND)))
        return
    assert (env.group(1) == "True") == v["sparse_prefill_switch"]["default"]
    assert int(thr.group(1)) == v["sparse_prefill_threshold"]


@pytest.mark.parametrize("release", [r for r in RELEASES if merged({"release": r}).get("sparse_prefill_switch")])
def test_the_routing_condition_is_the_wheels(release):
    zf = need("sglang", release)
    v = merged({"release": release})
    conds = _switch_conditions(ast.parse(text(zf, BACKEND)))
    assert conds, "the switch is read somewhere"
    routing = [c for c in conds if "_LARGE_INDEXER_QUERY_THRESHOLD" in c]
    assert routing and all("is_extend_without_speculative" in c or "_use_sparse_prefill" in c or "num_qo_tokens" in c
                           for c in routing)
    assert any("is_extend_without_speculative" in c for c in routing) or "_use_sparse_prefill" in text(zf, BACKEND)
    sm120 = any("is_sm120" in c for c in routing)
    assert sm120 == (12 in v.get("sparse_prefill_archs_excluded", []))
    cp_routed_out = any("is_cp_active" in c for c in routing if "is_extend_without_speculative" in c)
    assert cp_routed_out == bool((v.get("context_parallel") or {}).get("never_routed"))


@pytest.mark.parametrize("release", RELEASES)
def test_context_parallelism_and_the_switch_are_the_wheels(release):
    zf = need("sglang", release)
    v = merged({"release": release})
    off, spared = _cp_switch_off(ast.parse(text(zf, HOOK) or ""))
    cp = v.get("context_parallel")
    assert off == bool(cp and cp["switch_off"])
    if off:
        assert spared == sorted(cp["switch_kept_for_models"])


@pytest.mark.parametrize("release", RELEASES)
def test_the_flashmla_package_the_backend_imports(release):
    zf = need("sglang", release)
    src = text(zf, BACKEND)
    v = merged({"release": release})
    if "sgl_kernel.flash_mla" in src:
        pin = next(p for p in v["release_pins"] if p.startswith("sglang-kernel=="))
        assert v["kernel_build"] == "sglang-kernel-" + pin.split("==")[1]
    elif "sglang.kernels.ops.attention.flash_mla_interface" in src:
        wrapper = text(zf, "sglang/kernels/ops/attention/flash_mla_interface.py")
        assert re.search(r"^import flash_mla$", wrapper, re.M) and "sgl-flash-mla==1.0.0" in v["release_pins"]
        assert v["kernel_build"] == "sgl-flash-mla-1.0.0"
    else:
        assert re.search(r"^\s+import flash_mla$", src, re.M), "the upstream package"
        assert v["kernel_build"] == "flashmla-9241ae3"


@pytest.mark.parametrize("release", RELEASES)
def test_late_layer_tails_are_the_wheels(release):
    zf = need("sglang", release)
    v = merged({"release": release})
    fields = text(zf, EXEC_FIELDS) or ""
    m = re.search(r"enable_decoder_swa_bounded_replay: A\[.*?\] = (\w+)", fields, re.S)
    tails = v.get("late_layer_tails")
    assert (m is not None) == (tails is not None)
    if m is not None and m.group(1) == "False":
        assert tails["default_on_models"] == []


SMALL_DECODE = "sglang/kernels/ops/attention/dsv4/decode_attention_sm100.py"


def unmodelled_step(kind: str) -> dict:
    return load("engines")["profiles"]["sglang-dsv4"]["unmodelled_steps"][kind]


def small_decode_span(release: str) -> dict | None:
    """The data's release entry of the engine's small-batch decode kernel for ``release`` (None: none)."""
    from validate_batch.engines.dsv4 import _span_for
    return _span_for(unmodelled_step("small_decode"), release)


def _constants(tree: ast.AST) -> dict:
    """Module-level ``NAME = <int>`` assignments."""
    out = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)):
            out[node.targets[0].id] = node.value.value
    return out


def _gate(tree: ast.AST) -> ast.If | None:
    """The ``if`` of the backend whose test calls ``can_use_swapab_attention`` (None: there is none)."""
    return next((n for n in ast.walk(tree) if isinstance(n, ast.If) and any(
        isinstance(c, ast.Call) and getattr(c.func, "id", None) == "can_use_swapab_attention" for c in ast.walk(n.test))),
        None)


@pytest.mark.parametrize("release", RELEASES)
def test_the_small_decode_kernel_gate_is_the_wheels(release):
    zf = need("sglang", release)
    gate = _gate(ast.parse(text(zf, BACKEND)))
    span = small_decode_span(release)
    spec = unmodelled_step("small_decode")
    assert (gate is None) == (span is None), release
    if gate is None:
        return
    test = ast.unparse(gate.test)
    # a DeepSeek-V4.1 model on SM100 (capability major 10) in a decode, verify or DRAFT_EXTEND_V2 forward
    assert "self.is_dsv41" in test and "get_platform().is_sm100" in test
    assert spec["models"] == ["deepseek_v41"] and spec["cc_majors"] == [10]
    got = {m for m, name in (("decode", "is_decode()"), ("target_verify", "is_target_verify()"),
                             ("draft_extend", "is_draft_extend_v2()")) if f"forward_mode.{name}" in test}
    assert got == set(spec["modes"])
    ret = gate.body[-1]
    assert isinstance(ret, ast.Return) and ast.unparse(ret.value).startswith("swapab_attention(")
    assert f"deepseek_v4_backend.py:{gate.lineno}-{ret.end_lineno}" in span["lines"]
    kern = ast.parse(text(zf, SMALL_DECODE))
    consts = _constants(kern)
    fn = next(n for n in kern.body if isinstance(n, ast.FunctionDef) and n.name == "can_use_swapab_attention")
    cond = ast.unparse(fn.body[-1].value)
    rows = re.search(r"0 < q\.shape\[0\] <= (\w+)", cond).group(1)
    # the cited lines hold the constants the gate reads and the gate itself
    lo, hi, f0, f1 = map(int, re.search(r"decode_attention_sm100\.py:(\d+)-(\d+), :(\d+)-(\d+)", span["lines"]).groups())
    where = {n.targets[0].id: n.lineno for n in kern.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
    assert all(lo <= where[k] <= hi for k in ("LAYOUT", rows, "NUM_HEADS")) and (f0, f1) == (fn.lineno, fn.end_lineno)
    assert consts[rows] == span["max_rows"]
    heads = re.search(r"num_heads (==|in) (\(.*?\)|\w+)", cond)
    allowed = eval(heads.group(2), {}, dict(consts))          # names and products of the module's int constants
    assert sorted(allowed if isinstance(allowed, tuple) else (allowed,)) == span["heads_per_rank"]
    # the caches must be V4's (584 bytes a token): the layout setting's default is v4
    assert re.search(r"^LAYOUT = KVLayout\.V4$", text(zf, SMALL_DECODE), re.M)
    assert "kv.shape[-1] == LAYOUT.bytes_per_token" in cond
    default = re.search(r"^\s*SGLANG_DSV4_KV_LAYOUT = EnvStr\(\"(\w+)\"\)", text(zf, ENVIRON), re.M).group(1)
    assert default == spec["kv_layout_default"] and default in span["kv_layouts"]


def _server_arg_text(zf: zipfile.ZipFile) -> str:
    return "".join(zf.read(n).decode("utf-8") for n in zf.namelist()
                   if n == "sglang/srt/server_args.py" or (n.startswith("sglang/srt/arg_groups/") and n.endswith(".py")))


CP_SETTINGS = ("enable_prefill_cp", "enable_dsa_prefill_context_parallel", "enable_nsa_prefill_context_parallel")


@pytest.mark.parametrize("release", RELEASES)
def test_context_parallel_reindexing_is_the_wheels(release):
    from validate_batch.engines.dsv4 import _span_for
    zf = need("sglang", release)
    spec = unmodelled_step("context_parallel_extend")
    fn = next((n for n in ast.walk(ast.parse(text(zf, BACKEND)))
               if isinstance(n, ast.FunctionDef) and n.name == "apply_cp_reindex"), None)
    span = _span_for(spec, release)
    assert (fn is None) == (span is None), release
    if fn is None:
        return
    assert spec["reindex_lines"][release] == f"{fn.lineno}-{fn.end_lineno}"
    src = ast.unparse(fn)
    assert "cp_rank" in src and "cp_size" in src and "slice(cp_rank, None, cp_size)" in src   # this rank's rows
    fields = _server_arg_text(zf)
    have = [n for n in CP_SETTINGS if re.search(rf"^\s+{n}\s*:", fields, re.M)]
    assert sorted(have) == sorted(span["settings"]), release
    assert re.search(rf"^\s+{spec['width_setting']}\s*:", fields, re.M)


# --------------------------------------------------------------------------- sglang-kernel binaries
KERNEL_BUILDS = {k: b for k, b in load("flashmla")["builds"].items() if k.startswith("sglang-kernel-")}
COMBINE = re.compile(rb"flash_fwd_mla_combine_kernelIN7cutlass10bfloat16_tELi512ELi8ELi(\d+)ELi256E")


def kernel_so(version: str) -> bytes:
    zf = need("sglang_kernel", version)
    name = next(n for n in zf.namelist() if n.startswith("sgl_kernel/flashmla_ops") and n.endswith(".so"))
    return zf.read(name)


def pin_of(build: str) -> str:
    return build[len("sglang-kernel-"):]


@pytest.mark.parametrize("build", sorted(KERNEL_BUILDS))
def test_the_combine_split_limit_is_the_binarys(build):
    so = kernel_so(pin_of(build))
    splits = sorted({int(x) for x in COMBINE.findall(so)})
    assert splits and splits == list(range(32, splits[-1] + 1, 32))
    assert generation(build, "sparse")["combine"]["max_num_sm_parts"] == splits[-1]
    assert b"using low-smem fallback kernel" in so and "fallback" in generation(build, "sparse")["sched_smem"]


def test_the_feb_2026_fork_build_is_sglang_kernel_0_4_2_post2():
    so = kernel_so("0.4.2.post2")
    splits = sorted({int(x) for x in COMBINE.findall(so)})
    assert generation("sgl-kernel-flashmla", "sparse")["combine"]["max_num_sm_parts"] == splits[-1] == 160


def _cuobjdump() -> str | None:
    return os.environ.get("VALIDATE_BATCH_CUOBJDUMP") or shutil.which("cuobjdump")


def ctaid_axes(so: bytes) -> set[str]:
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (VALIDATE_BATCH_CUOBJDUMP or PATH)")
    fn = COMBINE.search(so).group(0).decode()
    name = f"_ZN4smxx6decode28{fn}EEv13CombineParams"
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(so)
        f.flush()
        out = subprocess.run([tool, "-sass", "-fun", name, f.name], capture_output=True, text=True, timeout=300).stdout
    axes = set(re.findall(r"SR_CTAID\.([XYZ])", out))
    assert axes, "the combine kernel was disassembled"
    return axes


GRID_AXES = {"bsq_x": {"X", "Z"}, "b_x__sq_y__hq_z": {"X", "Y", "Z"}}


@pytest.mark.parametrize("build", sorted(KERNEL_BUILDS) + ["sgl-kernel-flashmla"])
def test_the_combine_grid_is_the_binarys(build):
    version = "0.4.2.post2" if build == "sgl-kernel-flashmla" else pin_of(build)
    axes = ctaid_axes(kernel_so(version))
    assert axes == GRID_AXES[generation(build, "sparse")["combine"]["grid"]]


# --------------------------------------------------------------------------- server-argument names per release
def _annotated(tree: ast.AST, cls: str | None = None) -> set[str]:
    out = set()
    for c in ast.walk(tree):
        if isinstance(c, ast.ClassDef) and (cls is None or c.name == cls):
            out |= {n.target.id for n in c.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return out


def test_sglang_0512_server_argument_names_are_the_dataclass_fields():
    zf = need("sglang", "0.5.12")
    fields = _annotated(ast.parse(text(zf, "sglang/srt/server_args.py")), "ServerArgs")
    assert fields and fields == set(load("engine_args")["engines"]["sglang@0.5.12"]["names"])


def test_sglang_0523_annotated_setting_fields_are_known_names():
    # the derived fields (attn_tp_size, ...) are not annotated in the namespaces: only the annotated part is checked
    zf = need("sglang", "0.5.23")
    fields = set()
    for name in zf.namelist():
        if name.startswith("sglang/srt/arg_groups/fields/") and name.endswith(".py"):
            fields |= {f for f in _annotated(ast.parse(text(zf, name))) if not f.startswith("_")}
    assert fields and fields <= set(load("engine_args")["engines"]["sglang@0.5.23"]["names"])
