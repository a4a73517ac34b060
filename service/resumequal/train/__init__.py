"""Training inside a worker: process-group setup, the loop, cut points, graceful stops.

Owns the order of operations in one update and when checkpoints are taken. Must not
compare legs, launch processes or talk to a cluster.
"""
