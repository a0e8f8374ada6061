"""What the wheel installs: one import package, ``validate_batch``, with the data inside it; nothing that
can collide with another project's top-level ``validator`` or ``rules``, or with a user's ``rules.py``.

The collision cases run in a child Python whose path starts with a folder holding a stand-in for PyPI's
``validator`` package (a package of that name that fails when imported, so any import of it shows) and
a user's own ``rules.py`` (likewise). CI repeats the check with PyPI's real ``validator`` installed
beside the wheel (``.ci/run``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:      # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_room_of_the_code_and_the_data_is_a_listed_package():
    folders = {"validate_batch" + "".join("." + part for part in d.relative_to(ROOT / "validator").parts)
               for d in [ROOT / "validator", *(ROOT / "validator").rglob("*")]
               if d.is_dir() and (d / "__init__.py").exists()}
    assert set(CONFIG["packages"]) == folders | {"validate_batch.rules"}
    assert CONFIG["package-dir"] == {"validate_batch": "validator", "validate_batch.rules": "rules"}


def test_the_wheel_has_one_top_level_package():
    tops = {p.split(".")[0] for p in CONFIG["packages"]}
    assert tops == {"validate_batch"}
    assert {e["name"].split(".")[0] for e in CONFIG.get("ext-modules", [])} <= {"validate_batch"}


@pytest.fixture
def crowded(tmp_path):
    """A folder first on the path with another ``validator`` package and a user's ``rules.py``."""
    (tmp_path / "validator").mkdir()
    (tmp_path / "validator" / "__init__.py").write_text("raise ImportError('the other validator package was imported')\n")
    (tmp_path / "rules.py").write_text("raise ImportError('the user rules.py was imported')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path, env


def test_the_api_works_beside_another_validator_package_and_a_users_rules_py(crowded):
    folder, env = crowded
    script = folder / "use_api.py"
    script.write_text(
        "import validate_batch\n"
        "r = validate_batch.check({'kind': 'sparse', 'b': 11623, 's_q': 1, 'h_q': 64, 'd_qk': 512, 'topk': 512},"
        " gpu='H200', build='flashmla-9241ae3')\n"
        "print(r.legal, [f.code for f in r.findings])\n")
    out = subprocess.run([sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # 4*(5b+1) bytes at b = 11623 is 232464 > 232448, the H200's opt-in shared memory per block
    assert 4 * (5 * 11623 + 1) > 232448 >= 4 * (5 * 11622 + 1)
    assert out.stdout.split("\n")[0] == "False ['FMLA001']"


def test_the_command_works_beside_them_too(crowded):
    folder, env = crowded
    out = subprocess.run([sys.executable, "-m", "validate_batch", "check", "--example", "dsv4-prefill-3x4096",
                          "--build", "flashmla-9241ae3"], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    # exit 1: illegal (12288 rows > 11622), not a crash of the tool (exit 4) or an import failure
    assert out.returncode == 1, out.stderr
    assert "FMLA001" in out.stdout and "Traceback" not in out.stderr


def test_the_old_build_spellings_still_work():
    import validate_batch

    rec = {"kind": "sparse", "b": 11623, "s_q": 1, "h_q": 64, "d_qk": 512, "topk": 512}
    by_build = validate_batch.check(rec, gpu="H200", build="flashmla-9241ae3")
    by_kernel = validate_batch.check(rec, gpu="H200", kernel="flashmla-9241ae3")
    assert [f.code for f in by_build.findings] == [f.code for f in by_kernel.findings] == ["FMLA001"]
    with pytest.raises(validate_batch.InputError) as e:
        validate_batch.check(rec, gpu="H200", build="flashmla-9241ae3", kernel="sgl-flash-mla-1.0.0")
    assert e.value.field == "kernel"
    assert validate_batch.Checker(engine="sglang-dsv4@pre-25418", kernel="flashmla-9241ae3").kernel_build == "flashmla-9241ae3"


def test_the_package_says_the_distributions_version():
    # --version prints the package's __version__ (reading the install's metadata costs more than the
    # rest of the command): it is the version pyproject.toml gives the distribution
    import validate_batch
    from validate_batch.cli.version import version_line

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert validate_batch.__version__ == project["version"]
    assert version_line().startswith(f"validate-batch {project['version']} (")
