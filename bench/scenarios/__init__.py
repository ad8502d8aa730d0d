"""One study a module, each declaring ``SCENARIO`` (:class:`bench.harness.scenario.Scenario`)."""
