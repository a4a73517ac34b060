"""The entry point of the cluster's comparator Job (``resumequal compare``), and what a
comparison Job does to the run location it is given by URI.

Owns opening a run location as its run's own (its seal) and publishing what a Job found
into it; the zoom Job (``resumequal zoom``, :mod:`resumequal.zoom.job`) does both through
here. Must not start legs, deliver kills or time them out (:mod:`resumequal.local`, the
operator), nor judge or replay by itself: the comparison is :mod:`resumequal.compare`'s,
the replays :mod:`resumequal.zoom`'s.
"""
