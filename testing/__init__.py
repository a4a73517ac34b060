"""Test doubles of other people's systems (the Kubernetes API server and the cluster side
around it), used by the tests and the benches.

Owns: stand-ins that behave as the upstream systems do, each rule naming the upstream
source it follows. Must not: be imported by the product (service/, operator/), nor hold
tests of its own (those are under tests/).
"""
