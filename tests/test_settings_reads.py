"""Launch-command parsing and the bisect settings summary read rules/settings.json: patch the table,
the answer follows."""
from __future__ import annotations

import json
from importlib import resources

import validate_batch.cli.bisect_cmd as cli_bisect
import validate_batch.ingest.launch as launch
from validate_batch.ingest.launch import EngineConfig, parse_launch
from validate_batch.facts.names import BOOL_FLAG_SETTINGS


def settings_file() -> dict:
    return json.loads(resources.files("rules").joinpath("settings.json").read_text(encoding="utf-8"))


def test_every_store_true_flag_of_the_data_is_a_bool_flag():
    d = settings_file()
    table = {k for k, v in d["settings"].items() if v.get("bool_flag")}
    other = set(d["bool_flags_other"]["flags"])
    assert other and not other & set(d["settings"])        # the extra flags are not settings of the table
    assert BOOL_FLAG_SETTINGS == table | other


def test_a_store_true_flag_does_not_swallow_the_next_token(monkeypatch):
    flag = settings_file()["bool_flags_other"]["flags"][0]
    cmd = f"sglang serve org/model --{flag.replace('_', '-')} oops --tp 4"
    assert parse_launch(cmd)[flag] is True
    monkeypatch.setattr(launch, "BOOL_FLAG_SETTINGS", frozenset())
    assert parse_launch(cmd)[flag] == "oops"               # without the data the flag takes a value


def test_aliases_come_from_the_table():
    for alias, name in settings_file()["aliases"].items():
        assert parse_launch(f"--{alias} 3")[name] == 3


def test_config_dict_keeps_the_launch_settings(monkeypatch):
    d = settings_file()["settings"]
    launch_keys = [k for k, v in d.items() if "launch" in v["used_by"]]
    cfg = EngineConfig()
    cfg.update({k: 1 for k in launch_keys} | {"not_a_setting": 1}, "test")
    assert list(cfg.to_dict()["values"]) == launch_keys
    monkeypatch.setattr(launch, "LAUNCH_SETTINGS", tuple(launch_keys[:2]))
    assert list(cfg.to_dict()["values"]) == launch_keys[:2]


def test_settings_summary_follows_the_summary_order(monkeypatch):
    order = settings_file()["summary_order"]
    cfg = EngineConfig()
    cfg.update({k: i for i, k in enumerate(reversed(order))} | {"page_size": 64, "enable_dp_attention": False,
                                                                "attn_dp_size": 1}, "test")
    text = cli_bisect._fmt_cfg(cfg)
    assert [p.split("=")[0] for p in text.split(", ")] == order   # and page_size, not in the order, is left out
    from validate_batch.facts import names

    monkeypatch.setattr(names, "SUMMARY_SETTINGS", ("page_size",))     # read when the summary is written
    assert cli_bisect._fmt_cfg(cfg) == "page_size=64"
