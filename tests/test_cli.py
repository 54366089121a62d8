import subprocess
import sys
from pathlib import Path

import pytest

from suffice.training.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in COMMANDS:
        assert cmd in out


def test_unknown_command_names_the_fix(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "suffice.training.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "suffice COMMAND" in r.stdout


def test_promote_help_explains_every_option(capsys):
    from suffice.training.export.registry import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for option, words in (("--name", "registered model name"), ("--version", "model version"), ("--alias", "models:/NAME@ALIAS")):
        assert option in out and words in out, out


def test_make_mlflow_ui_port_is_a_variable():
    text = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert "MLFLOW_PORT ?= 5000" in text and "--port $(MLFLOW_PORT)" in text and "--port 5000" not in text
