"""The chart's tier: rendering by the real Helm engine, alert rules checked by promtool and
fired by a real Prometheus, the dashboard's queries run there; and what those tests read
(values files, promtool unit tests, monitoring object models)."""
