"""The install commands a user is shown must be ones that work: validate-batch is not on PyPI, so no
hint may send a user to ``pip install validate-batch`` or ``validate-batch[EXTRA]``; the ``[torch]``
extra must go into an SGLang 0.5.23 environment (which pins torch 2.14.1)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from validate_batch.install_hints import extra_requirements, install_hint
from validate_batch.kernel_mode.builds import INSTALL_HINTS

ROOT = Path(__file__).resolve().parents[1]
# `pip install validate-batch`, `pip install 'validate-batch[map]'`, `pip install "validate-batch[x]"`
FROM_PYPI = re.compile(r"pip install (?:-\S+ )*['\"]?validate-batch(?:\[|['\"\s]|$)")


def test_hints_name_installable_packages():
    for extra in ("map", "kernel", "torch"):
        h = install_hint(extra)
        assert not FROM_PYPI.search(h), h
        assert f"pip install '.[{extra}]'" in h
    assert "'matplotlib>=3.5'" in install_hint("map")
    assert extra_requirements("kernel") == ["sgl-flash-mla==1.0.0", "torch>=2.14.1"]
    for name, h in INSTALL_HINTS.items():
        assert not FROM_PYPI.search(h) and "validate-batch[" not in h, (name, h)


def test_no_source_or_readme_line_installs_from_pypi():
    files = [*ROOT.joinpath("validator").rglob("*.py"), ROOT / "README.md"]
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if FROM_PYPI.search(line) or "'validate-batch[" in line]
    assert not bad, "\n".join(bad)


def _torch_extra() -> str:
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (req,) = data["project"]["optional-dependencies"]["torch"]
    return req


def test_torch_extra_admits_the_ci_pin_and_sglang_0523s():
    specifiers = pytest.importorskip("packaging.specifiers")
    req = _torch_extra()
    assert req.startswith("torch")
    spec = specifiers.SpecifierSet(req[len("torch"):])
    # 2.13.0: the CPU build .ci/run pins; 2.14.1: sglang 0.5.23's METADATA `Requires-Dist: torch==2.14.1`
    assert "2.13.0" in spec and "2.14.1" in spec
    assert "2.8.0" not in spec and "2.15.0" not in spec
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q torch==2.13.0" in ci        # CI keeps the pinned CPU build


def test_torch_extra_and_installed_sglang_pin_agree():
    from importlib import metadata

    try:
        if metadata.version("sglang") != "0.5.23":
            pytest.skip("sglang 0.5.23 is not installed")
        pins = [r for r in metadata.requires("sglang") or [] if re.match(r"torch\s*==", r)]
    except metadata.PackageNotFoundError:
        pytest.skip("sglang 0.5.23 is not installed")
    specifiers = pytest.importorskip("packaging.specifiers")
    spec = specifiers.SpecifierSet(_torch_extra()[len("torch"):])
    assert pins and all(p.split("==")[1].split(";")[0].strip() in spec for p in pins), pins
