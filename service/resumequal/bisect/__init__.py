"""``resumequal bisect``: which change between two stack pins flips a verdict.

The room's modules, in the order a bisection uses them:

    pins      pin files (pip freeze, pylock.toml) read, compared, mixed (pure)
    search    delta debugging over changes, binary search over ordered pins (pure)
    envs      one venv per distinct set of requirements, cached and reused
    probe     one ``resumequal run`` in such a venv, its verdict read back
    runner    what qualifies a probe: the protocol, and the venv runner over envs and probe
    kubeapi   QualificationRuns created, read and deleted through the cluster's API
    cluster   the runner over images: a QualificationRun per qualification, its status read
    result    bisect.json's models (its JSON Schema is generated from them)
    html      bisect.html: the probes as a table and an inline SVG plot
    terminal  progress while probes build and run, and the summary after
    bisection the one function the command calls: confirm the ends, search, write

It never imports torch: every qualification runs in a probe venv of its own, in a
process of its own, or on a cluster, and the bisection reads what that process or the
operator wrote.
"""
