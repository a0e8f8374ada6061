"""The forward-mode type: its members, predicates, parsing, and that the code asks it rather than
comparing mode names."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from validate_batch.inputs.batch import batch_from_dict
from validate_batch.errors import InputError
from validate_batch.facts.modes import Mode
from validate_batch.facts.names import parse_mode

PKG = Path(__file__).resolve().parent.parent / "validator"
SETTINGS = json.loads((PKG.parent / "rules" / "settings.json").read_text())["forward_modes"]

# SGLang 0.5.23 ForwardMode (srt/model_executor/forward_batch_info.py): what each predicate answers
# for the members that are one of the validator's modes
SGLANG_TRUE = {
    "is_decode": {"decode"},
    "is_mixed": {"mixed"},
    "is_target_verify": {"target_verify"},
    "is_draft_extend": {"draft_extend"},
}


def test_members_are_the_table_modes_in_order():
    assert [m.value for m in Mode] == SETTINGS["modes"]


@pytest.mark.parametrize("pred, true", sorted(SGLANG_TRUE.items()))
def test_sglang_named_predicates_mean_what_sglang_means(pred, true):
    assert {m.value for m in Mode if getattr(m, pred)()} == true


def test_routable_is_the_table_and_decode_or_verify_reads_seq_lens():
    assert {m.value for m in Mode if m.is_routable()} == set(SETTINGS["routable"]) == {"extend", "mixed"}
    assert {m.value for m in Mode if m.is_decode_or_verify()} == {"decode", "target_verify"}


def test_a_mode_is_its_name_in_text_json_and_lookups():
    m = Mode.TARGET_VERIFY
    assert m == "target_verify" and "target_verify" == m
    assert f"{m} forward" == "target_verify forward" and str(m) == "target_verify"
    assert json.dumps({"forward_mode": m}) == '{"forward_mode": "target_verify"}'
    assert {"target_verify": 1}[m] == 1 and m in ("decode", "target_verify")
    assert ", ".join(Mode) == "extend, decode, mixed, target_verify, draft_extend"


@pytest.mark.parametrize("name, mode", [("extend", Mode.EXTEND), ("PREFILL", Mode.EXTEND), ("Decode", Mode.DECODE),
                                        ("verify", Mode.TARGET_VERIFY), ("draft", Mode.DRAFT_EXTEND),
                                        ("mixed", Mode.MIXED), (Mode.MIXED, Mode.MIXED)])
def test_parse_names_and_aliases(name, mode):
    assert Mode.parse(name) is mode and parse_mode(name) is mode


def test_idle_only_where_allowed():
    assert Mode.parse("idle", idle=True) is None and parse_mode("IDLE") is None
    with pytest.raises(InputError) as e:
        Mode.parse("idle", field="steps[3].mode")
    assert e.value.field == "steps[3].mode" and "got 'idle'" in str(e.value)


@pytest.mark.parametrize("bad", ["prefil", "", 3, None, ["decode"]])
def test_unknown_mode_names_the_field_and_the_choices(bad):
    with pytest.raises(InputError) as e:
        Mode.parse(bad, field="forward_mode")
    text = str(e.value)
    assert text.startswith("forward_mode") and "extend, decode, mixed, target_verify, draft_extend" in text
    assert "or idle" not in text
    with pytest.raises(InputError) as e:
        parse_mode(bad)
    assert "draft_extend or idle" in str(e.value)


def test_a_batch_holds_a_mode():
    b = batch_from_dict({"engine": "sglang-dsv4", "forward_mode": "Prefill", "requests": [{"id": "a", "extend_tokens": 3}]})
    assert b.forward_mode is Mode.EXTEND
    assert b.for_step("mixed", b.requests, None).forward_mode is Mode.MIXED
    assert b.to_doc()["forward_mode"].__class__ is str


# ------------------------------------------------------------------ no mode names compared by hand
MODE_NAMES = "|".join(SETTINGS["modes"] + ["idle", "prebuilt"])
BARE = re.compile(rf'(==|!=)\s*"({MODE_NAMES})"|in \("({MODE_NAMES})"')
# rewritten elsewhere, and not forward modes where they match (a log line's kind, a PD worker's role)
NOT_HERE = {"guard/checker.py", "inputs/quick.py", "flashmla/schedule.py"}
OTHER_MEANINGS = re.compile(r"disaggregation_mode|\.kind\b|\bkind ==")


def test_no_bare_mode_name_comparisons():
    found = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel in NOT_HERE:
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if BARE.search(line) and not OTHER_MEANINGS.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "compare forward modes through Mode:\n" + "\n".join(found)
