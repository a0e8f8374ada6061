"""The top-level help the console script writes without typer (:mod:`validate_batch.cli.tophelp`)
against typer's app, the real one the other command lines run through: the same commands in the
same order, each listed line the opening words of that command's own help, the same options with
the same help, the same description; and the script's answer to ``--help``, ``-h`` and a bare
command line (exit code, stream, what it loads)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from validate_batch.cli import app as cli_app, tophelp

ROOT = Path(__file__).resolve().parent.parent


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def group():
    g = typer.main.get_group(cli_app.app)
    return g, g.context_class(g, info_name="validate-batch")     # (typer's own click, not an installed one)


def test_the_listing_names_typers_commands_in_their_order(group):
    g, ctx = group
    assert [name for name, _ in tophelp.COMMANDS] == list(g.list_commands(ctx))


def test_each_listed_line_opens_that_commands_own_help(group):
    g, ctx = group
    for name, line in tophelp.COMMANDS:
        own = words(g.get_command(ctx, name).help or "")
        assert line.strip() and own.startswith(words(line)), (name, line, own[:120])


def test_the_options_are_typers_with_their_help():
    # typer's completion options exist only in the command it builds for a run: take them from there
    cmd = typer.main.get_command(cli_app.app)
    ctx = cmd.context_class(cmd, info_name="validate-batch", help_option_names=["-h", "--help"])
    theirs = {}
    for p in cmd.get_params(ctx):
        if p.param_type_name == "option":
            theirs[", ".join(sorted(p.opts, key=len))] = words(p.help or "")
    ours = {name: words(h) for name, h in tophelp.OPTIONS}
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name] == theirs[name], name


def test_the_description_is_the_apps():
    assert cli_app.app.info.help == tophelp.ABOUT


def test_the_text_carries_every_word_of_typers_plain_help(group):
    # typer's plain help (rich off, as for a pipe), 80 columns: its description and option lines,
    # word for word, in ours; its command lines each start ours (typer cuts them at 45 characters)
    g, ctx = group
    mode = cli_app.app.rich_markup_mode
    cli_app.app.rich_markup_mode = None
    try:
        from typer.testing import CliRunner

        theirs = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}).invoke(cli_app.app, ["--help"]).stdout
    finally:
        cli_app.app.rich_markup_mode = mode
    ours = tophelp.text(80)
    t_head, t_rest = theirs.split("\nOptions:", 1)
    o_head, o_rest = ours.split("\nOptions:", 1)
    assert words(t_head) == words(o_head)
    t_opts, t_cmds = t_rest.split("\nCommands:", 1)
    o_opts, o_cmds = o_rest.split("\nCommands:", 1)
    assert words(t_opts) == words(o_opts)
    for line in t_cmds.strip().splitlines():
        name, short = line.split(None, 1)
        assert words(o_cmds).find(words(f"{name} {short.rstrip('.').rstrip()}")) >= 0, line


@pytest.mark.parametrize("cols", [50, 60, 80])
def test_no_line_is_wider_than_the_columns_and_no_word_is_cut(cols):
    out = tophelp.text(cols)
    long_words = {w for w in tophelp.ABOUT.split() if len(w) + 4 > cols}
    for line in out.splitlines():
        assert len(line) <= cols or any(w in line for w in long_words), (cols, line)
    assert words(out).count(words('"d_qk": 512, "topk": 128}')) == 1    # a JSON example stays whole


PROBE = ("import atexit, json, sys\n"
         "atexit.register(lambda: sys.__stderr__.write('LOADED ' + json.dumps(sorted(m for m in "
         "('typer', 'click', 'rich', 'numpy', 'validate_batch.cli.app', 'validate_batch.legality') if m in sys.modules)) + '\\n'))\n"
         "from validate_batch.cli.main import main\n"
         "main()\n")


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["-h"], 0), ([], 2)])
def test_the_console_script_answers_without_typer(argv, code):
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, env={**__import__("os").environ, "COLUMNS": "80"})
    loaded = json.loads(next(ln for ln in p.stderr.splitlines() if ln.startswith("LOADED "))[7:])
    assert p.returncode == code and loaded == []
    assert p.stdout == tophelp.text(80)


def test_a_bare_command_line_exits_as_typers_does():
    # typer's app shows the help for a bare command line and exits 2 (a usage error)
    from typer.testing import CliRunner

    assert CliRunner().invoke(cli_app.app, []).exit_code == 2


@pytest.mark.parametrize("env, cols", [({"COLUMNS": "60"}, 60), ({"COLUMNS": "300"}, 80), ({"COLUMNS": "12"}, 50),
                                       ({"COLUMNS": "wide"}, 80)])
def test_the_width(monkeypatch, env, cols):
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    class Pipe:
        def fileno(self):
            raise OSError("not a terminal")

    assert tophelp.width(Pipe()) == cols
