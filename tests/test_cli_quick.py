"""Quick batches from command-line flags: the same verdicts as the batch files."""
import json

from typer.testing import CliRunner

from validate_batch.cli.main import app

runner = CliRunner()
LIMIT = (232448 - 4) // 20


def run(*args):
    res = runner.invoke(app, ["check", *args, "--json"])
    return res.exit_code, (json.loads(res.stdout) if res.exit_code in (0, 1) else res.stderr)


def test_quick_seed_batch_matches_the_file():
    rc, d = run("--engine", "sglang-dsv4@pre-25418", "--extend", "3x4096", "--decode", "1")
    assert rc == 1 and d["query_rows"] == 3 * 4096
    assert d["safe_split"]["num_steps"] == 2


def test_quick_mixed_chunk_counts_the_decode():
    rc, d = run("--engine", "sglang-dsv4@pre-25418", "--extend", "4096,4096,4096", "--decode", "1",
                "--server-arg", "enable_mixed_chunk=true")
    assert rc == 1 and d["query_rows"] == 3 * 4096 + 1


def test_quick_single_prompt_legal_at_the_limit():
    rc, d = run("--engine", "sglang-dsv4@pre-25418", "--extend", str(LIMIT))
    assert rc == 0 and d["legal"] is True


def test_quick_slots():
    rc, d = run("--engine", "sglang-slots@pre-fix", "--mode", "draft_extend", "--extend", "4,4", "--slots", "3,96",
                "--server-arg", "max_running_requests=32", "--server-arg", "disaggregation_mode=decode",
                "--server-arg", "disaggregation_decode_extra_slots=64", "--server-arg", "speculative_num_draft_tokens=4")
    assert rc == 1
    f = [f for f in d["findings"] if f["code"] == "SLOT002"]
    assert f and f[0]["numbers"]["slot"] == 96 and f[0]["numbers"]["buffer_rows"] == 32 + 1


def test_quick_bad_flags_exit_2_naming_the_flag():
    for args, flag in [(["--extend", "3y4096"], "--extend"), (["--extend", "1,2", "--slots", "1"], "--slots"),
                       (["--extend", "5", "--server-arg", "novalue"], "--server-arg")]:
        rc, err = run("--engine", "sglang-dsv4", *args)
        assert rc == 2 and flag in err
