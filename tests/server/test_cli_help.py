"""Issue 43: a CLI a user can read. `flare run --help` shows operators' flags first and the
scheduler's study switches last, every flag has help and shows its default, `flare --help` imports
nothing heavy, combinations are refused before the model loads, and pyproject's license is SPDX."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tomllib

from helios.cli import build_parser, main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_operator_flags_come_first_and_study_switches_last():
    titles = [g.title for g in _run_parser()._action_groups if g._group_actions]
    assert titles[1] == "server" and titles[-1].startswith("scheduler internals")
    server = {a.option_strings[0] for g in _run_parser()._action_groups if g.title == "server"
              for a in g._group_actions}
    assert {"--model", "--port", "--slots", "--max-context", "--weights", "--served-model-name"} <= server
    text = _run_parser().format_help()
    assert text.index("--model PATH") < text.index("--engine") < text.index("--api-key") < text.index("--scheduler-adaptation-ms")


def test_every_flag_has_help_and_shows_its_default():
    parser = _run_parser()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        assert action.help, action.option_strings
        shown = parser._get_formatter()._get_help_string(action)
        if action.default not in (None, False, True):
            assert "default" in shown, (action.option_strings, shown)


def test_flare_help_imports_nothing_heavy():
    code = ("import sys, contextlib, io\n"
            "from helios.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: main(['run', '--help'])\n"
            "    except SystemExit: pass\n"
            "print(','.join(m for m in ('torch', 'fastapi', 'uvicorn', 'gguf', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_baseline_with_speculation_is_refused_before_torch_loads():
    code = ("import sys\nfrom helios.cli import main\n"
            "rc = main(['run', '--scheduler', 'vllm-fcfs', '--speculation', 'fixed'])\n"
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert out.stderr.count("\n") == 1 and "--scheduler" in out.stderr


def test_license_is_an_spdx_expression():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"


def test_interrupt_during_startup_is_one_line(monkeypatch, capsys):
    import helios.server.command as command

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(command, "run", interrupted)
    assert main(["run", "--engine", "sim"]) == 130
    assert capsys.readouterr().err.strip() == "flare: interrupted during startup"
