"""Server-argument names: a typo is an error naming the field and the closest known name, never a
silently dropped setting; the engines' own argument names (read from their wheels into
rules/engine_args.json) are accepted."""
import json

import pytest
from typer.testing import CliRunner

from validate_batch import Checker, check
from validate_batch.cli.main import app
from validate_batch.errors import InputError

runner = CliRunner()
DOC = {"engine": "sglang-dsv4@pre-25418", "forward_mode": "extend", "requests": [{"id": "p1", "extend_tokens": 100}]}


def test_document_typo_names_the_field_and_the_closest_setting():
    with pytest.raises(InputError) as e:
        check({**DOC, "server_args": {"chunked_prefil_size": 8192}})
    assert e.value.field == "server_args.chunked_prefil_size"
    assert "did you mean 'chunked_prefill_size'" in e.value.message


def test_checker_mapping_typo_is_an_error():
    with pytest.raises(InputError) as e:
        Checker("sglang-dsv4@pre-25418", server_args={"enable_mixed_chunks": True})
    assert e.value.field == "server_args.enable_mixed_chunks"
    assert "'enable_mixed_chunk'" in e.value.message


def test_non_string_key_is_an_error():
    with pytest.raises(InputError) as e:
        check({**DOC, "server_args": {1: 2}})
    assert e.value.field == "server_args"


@pytest.mark.parametrize("name", [
    "mem_fraction_static",          # SGLang: fraction of memory for static allocation
    "--chunked-prefill-size",       # a command-line spelling of a setting
    "tp",                           # an alias
    "gpu_memory_utilization",       # vLLM
    "max_num_batched_tokens",       # vLLM
    "cuda_graph_max_bs",            # SGLang 0.5.12 (renamed in 0.5.23)
])
def test_real_engine_names_are_accepted(name):
    rep = check({**DOC, "server_args": {name: 1 if "fraction" not in name and "util" not in name else 0.8}})
    assert rep.legal


def test_cli_server_arg_typo_exits_2_with_the_hint():
    res = runner.invoke(app, ["check", "--engine", "sglang-dsv4@pre-25418", "--extend", "100",
                              "--server-arg", "chunked_prefil_size=8192", "--json"])
    assert res.exit_code == 2
    assert "chunked_prefil_size" in res.stderr and "chunked_prefill_size" in res.stderr


def test_cli_server_arg_known_name_still_read():
    # enable_mixed_chunk is read: 3 x 4096 prompt rows plus the merged decode = 12289 rows
    res = runner.invoke(app, ["check", "--engine", "sglang-dsv4@pre-25418", "--extend", "3x4096", "--decode", "1",
                              "--server-arg", "--enable-mixed-chunk=true", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["query_rows"] == 3 * 4096 + 1


def test_bisect_server_arg_typo_exits_2(tmp_path):
    from pathlib import Path
    log = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "sglang-dsv4-prefill-12288.log"
    res = runner.invoke(app, ["bisect", str(log), "--server-arg", "max_prefil_tokens=8192"])
    assert res.exit_code == 2
    assert "max_prefill_tokens" in res.stderr
