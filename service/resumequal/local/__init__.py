"""Running a qualification on this machine: torchrun legs, beacons, kills, timeouts.

Owns processes it starts and their cleanup (no orphans). Must not look inside training
(it reads what workers write) nor decide verdicts (the comparator does).
"""
