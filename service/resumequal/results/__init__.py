"""What a qualification concluded: the verdict and report schema, the seed matrix, the
report's assembly, its Prometheus metrics and publishing.

Shared with the operator, so free of torch and numpy; it judges nothing (``compare`` does)
and renders nothing (``report`` does).
"""
