"""How to install an optional part of validate-batch.

validate-batch is not published on PyPI (``pip install validate-batch`` finds nothing, or someone
else's package), so a hint never names ``validate-batch[EXTRA]`` alone: it names the packages the
extra adds (read from the installed package's metadata, so the hint follows ``pyproject.toml``),
then the extra installed from a checkout of the repository or from a wheel built from it
(``pip wheel --no-deps -w dist/ .``; README "Install").
"""
from __future__ import annotations

#: the extras as ``pyproject.toml`` declares them, for a source tree that is not installed
FALLBACK = {"map": ["matplotlib>=3.5"], "torch": ["torch>=2.9,<2.15"],
            "kernel": ["sgl-flash-mla==1.0.0", "torch>=2.14.1"], "test": ["pytest>=7", "hypothesis>=6",
                                                                         "matplotlib>=3.5", "jsonschema>=4.18"]}


def extra_requirements(extra: str) -> list[str]:
    """The requirements the extra ``extra`` adds, from the installed metadata (else :data:`FALLBACK`)."""
    try:
        from importlib.metadata import PackageNotFoundError, requires
    except ImportError:  # pragma: no cover - Python >= 3.8 has it
        return list(FALLBACK.get(extra, []))
    try:
        reqs = requires("validate-batch") or []
    except PackageNotFoundError:
        return list(FALLBACK.get(extra, []))
    out = []
    for r in reqs:
        req, _, marker = r.partition(";")
        if f'extra == "{extra}"' in marker.replace("'", '"'):
            out.append(req.strip().replace(" ", ""))
    return out or list(FALLBACK.get(extra, []))


def install_hint(extra: str) -> str:
    """``pip install 'PKG'...`` for what the extra adds, and the extra from a checkout or a wheel."""
    pkgs = " ".join(f"'{r}'" for r in extra_requirements(extra))
    return (f"pip install {pkgs} (what the [{extra}] extra adds; validate-batch itself is not on PyPI: "
            f"from a checkout of its repository, pip install '.[{extra}]')")
