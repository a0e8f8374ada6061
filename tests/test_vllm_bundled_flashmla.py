"""vLLM's bundled FlashMLA builds (``vllm-<major>.<minor>`` in rules/flashmla.json) against the
release files themselves.

Where the files come from:

* the source distributions (``vllm-<version>.tar.gz``, whose ``cmake/external_projects/flashmla.cmake``
  names the FlashMLA commit the wheel was built from): ``VALIDATE_BATCH_VLLM_SDIST``, one or more
  files or folders separated by ``os.pathsep``;
* the wheels (``vllm-<version>-*.whl``): ``VALIDATE_BATCH_VLLM_WHEEL``, a wheel or a folder; a
  release's wheel is looked for beside the one named (``tests/vllm_release.py``).

A release whose file is not there skips, saying so. The kernel comparison also needs ``cuobjdump``
(``VALIDATE_BATCH_CUOBJDUMP`` or on ``PATH``): it extracts every cubin of ``_flashmla_C`` from both
wheels and compares their disassembly, so that a build that claims another's kernels
(``same_kernels_as``) is held to the binaries, not to the claim.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

import vllm_release
from validate_batch.facts.knowledge import load

BUILDS = load("flashmla")["builds"]
VLLM_BUILDS = sorted(b for b in BUILDS if b.startswith("vllm-"))
KERNELS = "vllm/_flashmla_C.abi3.so"
EXTENSION = "vllm/_flashmla_extension_C.abi3.so"
INTERFACE = "vllm/third_party/flashmla/flash_mla_interface.py"


def release(build: str) -> str:
    """``vllm-0.34`` -> ``0.34.0``: the one release each bundled build names."""
    return build.removeprefix("vllm-") + ".0"


def sdist(version: str) -> Path:
    for part in filter(None, os.environ.get("VALIDATE_BATCH_VLLM_SDIST", "").split(os.pathsep)):
        p = Path(part)
        cand = p / f"vllm-{version}.tar.gz" if p.is_dir() else p
        if cand.is_file() and cand.name == f"vllm-{version}.tar.gz":
            return cand
    pytest.skip(f"vllm-{version}.tar.gz not given (VALIDATE_BATCH_VLLM_SDIST: a file or folder)")


@pytest.mark.parametrize("build", VLLM_BUILDS)
def test_vllm_flashmla_commit_is_its_sdists(build):
    version = release(build)
    with tarfile.open(sdist(version)) as tf:
        cm = tf.extractfile(f"vllm-{version}/cmake/external_projects/flashmla.cmake").read().decode()
    repo = re.search(r"GIT_REPOSITORY https://github.com/(\S+)", cm).group(1)
    tag = re.search(r"GIT_TAG ([0-9a-f]{40})", cm).group(1)
    assert BUILDS[build]["fork_commit"] == f"{repo} {tag}"


def _wheel(version: str) -> zipfile.ZipFile:
    path, why = vllm_release.wheel_path(version)
    if path is None:
        pytest.skip(why)
    return zipfile.ZipFile(path)


def _cuobjdump() -> str:
    tool = os.environ.get("VALIDATE_BATCH_CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        pytest.skip("no cuobjdump (VALIDATE_BATCH_CUOBJDUMP or PATH)")
    return tool


#: the offset comment that starts each instruction line of the disassembly
_OFFSET = re.compile(r"/\*[0-9a-f]{4,}\*/")
#: a code address or a large immediate: an instruction inserted earlier in a kernel moves every branch
#: and call target, return address and WARPSYNC mask after it
_NUMBER = re.compile(r"0x[0-9a-f]{3,}")


def _cubins(tool: str, so: bytes, where: Path) -> dict[str, list[str]]:
    """Each cubin of the library by its index and architecture (``61.sm_90a``): its disassembly,
    instruction and encoding per line, without the offsets."""
    where.mkdir()
    (where / "lib.so").write_bytes(so)
    subprocess.run([tool, "-xelf", "all", "lib.so"], cwd=where, capture_output=True, check=True, timeout=600)
    out = {}
    for cubin in sorted(where.glob("*.cubin")):
        key = ".".join(cubin.name.split(".")[-3:-1])
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True,
                              timeout=600).stdout
        out[key] = [" ".join(_OFFSET.sub("", ln).split()) for ln in sass.splitlines() if ln.strip()]
    return out


def _changed_instructions(a: list[str], b: list[str]) -> list[str]:
    """The instructions one disassembly has and the other has not, with the per-line encodings
    dropped and code addresses blanked (so that one inserted instruction is one changed line)."""
    import difflib

    def norm(lines):
        out = (_NUMBER.sub("@", re.sub(r"/\* 0x[0-9a-f]{16} \*/", "", ln)).strip() for ln in lines)
        return [ln for ln in out if ln]
    return [ln for ln in difflib.unified_diff(norm(a), norm(b), lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


@pytest.mark.parametrize("build", [b for b in VLLM_BUILDS if BUILDS[b].get("same_kernels_as")])
def test_a_build_that_claims_anothers_sm90_kernels_has_them(build, tmp_path):
    """Every sm_90a cubin of the build's ``_flashmla_C`` disassembles to the other build's
    instructions, but for the two dense decode cubins, which may only add an ``ACQBULK`` (and drop the
    ``NOP`` it replaces); the dense fp8 extension and the Python interface are the same files."""
    other = BUILDS[build]["same_kernels_as"]
    new, old = _wheel(release(build)), _wheel(release(other))
    ext_new, ext_old = new.read(EXTENSION), old.read(EXTENSION)
    assert hashlib.sha256(ext_new).hexdigest() == hashlib.sha256(ext_old).hexdigest()
    prov = BUILDS[build]["dense_fp8_partitions"]["provenance"]
    read = next(e for e in (prov if isinstance(prov, list) else [prov]) if e["kind"] == "read")
    assert hashlib.sha256(ext_new).hexdigest() in read["at"]
    assert new.read(INTERFACE) == old.read(INTERFACE)
    tool = _cuobjdump()
    a = _cubins(tool, old.read(KERNELS), tmp_path / "old")
    b = _cubins(tool, new.read(KERNELS), tmp_path / "new")
    assert sorted(a) == sorted(b)
    sm90 = [k for k in a if k.endswith("sm_90a")]
    # the same instructions, encodings included, cubin for cubin; where not, only the dense decode kernel
    differ = {k: _changed_instructions(a[k], b[k]) for k in sm90 if a[k] != b[k]}
    for k, lines in differ.items():
        assert any("legacy4sm906decode5dense28flash_fwd_splitkv_mla_kernel" in ln for ln in a[k]), k
        assert sorted(set(ln[1:].strip() for ln in lines)) == ["ACQBULK ;", "NOP;"], (k, lines[:6])
        assert sum(ln.startswith("+") for ln in lines) == 2, (k, lines)     # one per head size's kernel
    assert len(differ) <= 2
    claim = BUILDS[build]["same_kernels_source"]
    assert f"of its {len(sm90)} sm_90a cubins {len(sm90) - len(differ)} disassemble to the same" in claim


def _host_functions(so: bytes, where: Path) -> dict[str, list[str]]:
    """The library's host functions by name: their x86-64 instructions, addresses blanked (numbers of
    four hex digits or more), small immediates such as ``__LINE__`` kept."""
    tool = shutil.which("objdump")
    if not tool:
        pytest.skip("no objdump")
    where.write_bytes(so)
    text = subprocess.run([tool, "-d", "--no-show-raw-insn", "-C", str(where)], capture_output=True, text=True,
                          check=True, timeout=600).stdout
    out: dict[str, list[str]] = {}
    cur = None
    for ln in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", ln)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        if cur is not None and ln.strip():
            ln = re.sub(r"<[^>]*>", "", re.sub(r"^\s*[0-9a-f]+:\s*", "", ln))
            cur.append(re.sub(r"0x[0-9a-f]{4,}|\b[0-9a-f]{5,}\b", "@", ln))
    return out


@pytest.mark.parametrize("build", [b for b in VLLM_BUILDS if BUILDS[b].get("same_kernels_as")])
def test_the_host_code_behind_the_error_sites_is_the_same(build, tmp_path):
    """The scheduler's and the combine kernel's host functions (their checks, and the ``__LINE__`` each
    error message prints, which the crash signatures match) are the other build's instruction for
    instruction; what differs is named in the build's ``same_kernels_source``."""
    other = BUILDS[build]["same_kernels_as"]
    a = _host_functions(_wheel(release(other)).read(KERNELS), tmp_path / "old.so")
    b = _host_functions(_wheel(release(build)).read(KERNELS), tmp_path / "new.so")
    assert set(a) == set(b)
    differ = sorted(k for k in a if a[k] != b[k])
    sites = [k for k in a if re.search(r"combine|sched_meta|get_mla", k, re.I)]
    assert len(sites) >= 5 and not set(sites) & set(differ), [k for k in sites if k in differ][:5]
    assert all(re.search(r"sm100|fused_norm_rope|permute_|resolve_fp8|annobin|legacy::sm90::decode::dense::run_flash",
                         k) for k in differ), [k for k in differ][:10]
    assert f"{len(differ)} of its {len(a)} host functions differ" in BUILDS[build]["same_kernels_source"]


# ----------------------------------------------------------------------------- vLLM's bundled DeepGEMM
DEEPGEMM = load("deepgemm")["versions"]
SM90_METADATA = "vllm/third_party/deep_gemm/include/deep_gemm/scheduler/sm90_paged_mqa_logits.cuh"


@pytest.mark.parametrize("name", sorted(k for k, v in DEEPGEMM.items() if v.get("vendored_by") and v.get("fork_commit")))
def test_vllm_deepgemm_commit_is_its_sdists(name):
    version = DEEPGEMM[name]["vendored_by"].split()[-1] + ".0"
    with tarfile.open(sdist(version)) as tf:
        cm = tf.extractfile(f"vllm-{version}/cmake/external_projects/deepgemm.cmake").read().decode()
    repo = re.search(r'_DEEPGEMM_UPSTREAM_REPO "https://github.com/(\S+?)(?:\.git)?"', cm).group(1)
    tag = re.search(r'_DEEPGEMM_UPSTREAM_TAG "([0-9a-f]{40})"', cm).group(1)
    assert DEEPGEMM[name]["fork_commit"] == f"{repo} {tag}"


def test_vllm_034_deepgemm_keeps_the_sm90_metadata_kernel():
    """The SM90 metadata kernel's header (what the JIT compiles) is 0.33.0's byte for byte, and the version
    string is the same; the copy is judged by its own entry, which carries 0.33.0's SM90 facts."""
    from validate_batch.kernel_mode.libraries import deepgemm_build
    new, old = _wheel("0.34.0"), _wheel("0.33.0")
    assert new.read(SM90_METADATA) == old.read(SM90_METADATA)
    init = "vllm/third_party/deep_gemm/__init__.py"
    assert re.search(rb"__version__ = '2\.8\.1'", new.read(init)) and new.read(init) == old.read(init)
    assert b"smem_size <= SM90ArchSpec::smem_capacity" in new.read("vllm/third_party/deep_gemm/_C_extension.abi3.so")
    assert deepgemm_build("2.8.1", "vllm 0.34.0") == ("deepgemm-vllm-0.34", "")
    a, b = DEEPGEMM["deepgemm-vllm-0.33"], DEEPGEMM["deepgemm-vllm-0.34"]
    for key in ("split_kv", "atoms"):
        assert a["schedule"][key] == b["schedule"][key]
    assert a["metadata"]["9"]["bytes"] == b["metadata"]["9"]["bytes"] and a["smem_capacity"] == b["smem_capacity"]


def test_a_deepgemm_version_string_two_bundles_share_is_judged_by_their_common_facts():
    from validate_batch.kernel_mode.libraries import deepgemm_build
    build, note = deepgemm_build("2.8.1")              # found without the vLLM that vendors it
    assert build == "deepgemm-vllm-0.33" and "deepgemm-vllm-0.34" in note and "same SM90 facts" in note
    assert deepgemm_build("2.8.1", "vllm 0.33.0") == ("deepgemm-vllm-0.33", "")
