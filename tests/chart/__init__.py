"""What the chart tests read: values files, promtool unit tests, monitoring object models."""
