"""The entry points of the cluster's comparison Jobs: ``resumequal compare`` (the
comparator Job) and ``resumequal zoom`` (the zoom Job), each given a run location by URI.

Owns opening a run location as its run's own (its seal) and publishing what a Job found
into it. Must not start legs, deliver kills or time them out (:mod:`resumequal.local`, the
operator), nor judge or replay by itself: the comparison is :mod:`resumequal.compare`'s,
the replays :mod:`resumequal.local.zoom`'s.
"""
