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


def test_by_default_the_stats_are_one_measurement() -> None:
    options = sink_options(parse_args(BASE))
    assert options["measurement"] == "stream_stats" and "measurement_column" not in options


def test_a_measurement_per_metric_reads_each_rows_measurement_from_its_column() -> None:
    options = sink_options(parse_args([*BASE, "--measurement-per-metric"]))
    assert options["measurement_column"] == "metric" and "measurement" not in options
    assert options["tags"] == "stream_id,isp" and options["time"] == "window_end"
