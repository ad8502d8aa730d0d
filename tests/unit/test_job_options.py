"""The job's command line: the sinks' options it makes (no Spark needed)."""

from __future__ import annotations

import pytest

from jobs.session_metrics import parse_args, sink_options

pytestmark = pytest.mark.unit

BASE = ["--input", "in", "--checkpoint", "chk", "--sink-id", "dash"]


def test_targets_given_on_the_command_line_become_the_sinks_option() -> None:
    options = sink_options(parse_args([*BASE, "--targets", "a=http://h1:8086,b=http://h2:8086"]))
    assert options["targets"] == "a=http://h1:8086,b=http://h2:8086"
    assert options["dead_letter_sink"] == "dash.malformed"


def test_without_targets_the_environment_decides() -> None:
    assert "targets" not in sink_options(parse_args(BASE))
