"""The package's layout: imports point one way, no private names cross modules, and function-level
imports are only where an import is truly optional. Read from the source with ``ast`` (nothing is
imported), so a new cycle anywhere fails here."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "validator"
#: the name the package installs under (pyproject maps validator/ to it)
IMPORT_NAME = "validate_batch"

# (module, imported module): function-level imports that stay, and why
OPTIONAL = {
    ("validate_batch._accel", "validate_batch._walk"): "the compiled helpers may not be built",
    ("validate_batch.kernel_mode.worker", "validate_batch.kernel_mode.worker"): "run as a script, it re-imports itself as a module",
    ("validate_batch.bisect.kernel", "validate_batch.kernel_mode.check"): "kernel mode is optional in a diagnosis",
}
# modules whose function-level imports are deliberate: loaded by every pytest run / CLI start-up
LAZY_MODULES = {
    "validate_batch.pytest_plugin": "pytest loads the plugin in every run; the package loads on first use",
    "validate_batch": "the package's names load on first use, so importing one submodule (the command line) "
                 "does not load every room",
    "validate_batch.cli.main": "the console script's entry: --version is answered before the commands load",
    "validate_batch.legality.catalog": "`rules` lists the shipped catalog file: the rule modules load only to "
                                       "write it, or where a file it was written from has changed",
}
# the command line's modules import the rooms a command runs when that command runs (each room costs
# 5-45 ms of start-up, and `--help` or `rules` needs none of most): any room, from inside a command
CLI_PACKAGE = "validate_batch.cli."
# the output writer loads kernel mode only for `--build auto`
CLI_MODULES = ("validate_batch.output.writer",)
CLI_LAZY = ("validate_batch.bisect", "validate_batch.ingest", "validate_batch.kernel_mode")
# a kernel family's calls (and the FlashMLA tensor checks) load with the first call of theirs: the
# record dispatch, the rules' pages and the setup's build name import them there, so a check of
# another family's batch loads none of them (tests/test_cli_start.py holds a DeepSeek-V4 check to it)
FAMILY_LAZY = ("validate_batch.deepgemm.calls", "validate_batch.flashinfer.calls",
               "validate_batch.flashinfer.mla_schedule", "validate_batch.flashmla.tensors")
FAMILY_IMPORTERS = ("validate_batch.api", "validate_batch.deepgemm.rules", "validate_batch.flashinfer.rules",
                    "validate_batch.legality.evaluate")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = (IMPORT_NAME,) + p.relative_to(PKG).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: Path, modules: dict) -> list[tuple[str, list[str], bool, int]]:
    """(target module, imported names, at function level, line) for every import of a project module."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith(IMPORT_NAME):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in modules or (PKG / (sub.split(".", 1)[-1].replace(".", "/") + ".c")).exists():
                    # "from . import x" imports module x (a compiled one too)
                    out.append((sub, [], id(node) in nested, node.lineno))
                elif mod in modules:
                    out.append((mod, [a.name], id(node) in nested, node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(IMPORT_NAME) and a.name in modules:
                    out.append((a.name, [], id(node) in nested, node.lineno))
    return out


def _graph():
    modules = _modules()
    return modules, {m: _imports(m, p, modules) for m, p in modules.items()}


def test_no_import_cycles():
    modules, edges = _graph()
    graph = {m: sorted({t for t, _, _, _ in es if t != m and not t.startswith(m + ".")}) for m, es in edges.items()}
    # a package's __init__ re-exporting its own modules is not a cycle of ideas: drop parent -> child edges
    for m in graph:
        graph[m] = [t for t in graph[m] if not t.startswith(m + ".")]
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, []):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    _, edges = _graph()
    bad = [f"{m}:{line} imports {t}.{n}" for m, es in edges.items() for t, names, _, line in es
           for n in names if n.startswith("_") and not n.startswith("__") and t != m]
    assert not bad, "\n".join(bad)


def test_function_level_imports_are_only_the_optional_ones():
    _, edges = _graph()
    bad = [f"{m}:{line} imports {t} inside a function" for m, es in edges.items() for t, _, nested, line in es
           if nested and (m, t) not in OPTIONAL and m not in LAZY_MODULES and not m.startswith(CLI_PACKAGE)
           and not (m in CLI_MODULES and t.startswith(CLI_LAZY))
           and not (m in FAMILY_IMPORTERS and t in FAMILY_LAZY)]
    assert not bad, "\n".join(bad)


def test_the_layout_test_sees_a_cycle(tmp_path, monkeypatch):
    # the cycle finder itself: two modules importing each other are reported
    pkg = tmp_path / "validator"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("from .a import y\n")
    monkeypatch.setattr(__import__(__name__), "PKG", pkg)
    try:
        test_no_import_cycles()
    except AssertionError as e:
        assert "validate_batch.a -> validate_batch.b -> validate_batch.a" in str(e)
    else:
        raise AssertionError("the cycle was not found")
