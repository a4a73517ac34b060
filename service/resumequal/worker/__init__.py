"""What runs where a leg's workers run, beside torchrun: a pod's main process (``launch``),
and the agent that forks workers from a warm process (``agent``).

It starts and supervises worker processes; the training itself is ``resumequal.train``'s.
"""
