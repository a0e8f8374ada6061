"""A reader that closes the output early (``validate-batch ... | head``) ends the command quietly, as
it ends ``cat``: killed by SIGPIPE, with no "internal error" line."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ORACLE = Path(__file__).resolve().parent.parent / "fixtures" / "oracle" / "flashmla_h200_cases.jsonl"


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="no SIGPIPE on this platform")
def test_metadata_into_a_closed_pipe():
    cmd = [sys.executable, "-c", "from validate_batch.cli.main import main; main()", "metadata", str(ORACLE), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(100)          # read a little, then close: the rest of the output has no reader
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=60)
    assert "internal error" not in err and "BrokenPipe" not in err, err
    assert rc == -signal.SIGPIPE
