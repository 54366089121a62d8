import subprocess
import sys

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
