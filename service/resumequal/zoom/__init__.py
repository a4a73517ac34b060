"""Zoom: replay a divergent step of the control leg and another leg, and say where it went
different, module by module and stage by stage.

Its modules, in the order a zoom uses them:

    replays   where each leg's replay starts, the torchrun replays on this machine, whether
              each reproduced the leg's step, ``zoom.json`` (``resumequal run`` zooms here)
    captures  two replays' per-rank captures compared tensor by tensor: the modules and
              stages that differ, where the difference starts, and the one-sentence summary
    job       ``resumequal zoom``, the cluster's zoom Job: a run location's zoom, written
              into it with the report's zoom section

It owns the replays it starts and the comparison of their captures. It must not judge a
run (the verdict is :mod:`resumequal.compare`'s; a zoom only explains a divergence) nor lay
a zoom out for people (:mod:`resumequal.report.zoom` renders the ``Zoom`` model, as the
report renders every other part of it).

It sits over :mod:`resumequal.jobs`, whose opening of and publishing into a run location
its Job uses, and over :mod:`resumequal.local`, whose process tree runs its replays: the
local runner is handed :func:`~resumequal.zoom.replays.zoomed` for ``spec.zoom: onFail``
and never imports this package. It imports nothing on its own: import the module you need
(:mod:`~resumequal.zoom.captures` loads torch).
"""
