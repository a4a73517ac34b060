"""The qualification state machine: which legs run (``plan``), the machine that drives
them wherever they run (``machine``) and the timeline it leaves (``timeline``).

It decides and records; it runs nothing itself (a backend does: ``resumequal.local`` or the
operator) and imports neither torch nor the training code.
"""
