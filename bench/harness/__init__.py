"""The bench's one harness: servers and scratch databases, the sides of a comparison,
CPU per process, statistics, the report (Markdown, JSON, one chart) and the command
``python -m bench <scenario>``. Each study is a scenario under ``bench/scenarios``."""
