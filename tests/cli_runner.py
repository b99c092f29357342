"""A click test runner that keeps stderr apart from stdout on every click the package accepts:
click >= 8.2 always does, 8.1 only when asked (`mix_stderr=False`, an argument 8.2 removed). The
CLI tests check that an error is one line on stderr, so they need the two apart."""

from __future__ import annotations

from click.testing import CliRunner


def cli_runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click 8.1
    except TypeError:
        return CliRunner()  # click >= 8.2
