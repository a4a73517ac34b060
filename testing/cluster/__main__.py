"""``python -m testing.cluster {build,up,down,status}``: the local cluster by hand
(``make cluster-up`` / ``make cluster-down``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from . import build
from .errors import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.cluster",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["build", "up", "down", "status"])
    parser.add_argument("--no-chart", action="store_true",
                        help="up: leave the resumequal chart uninstalled")
    parser.add_argument("--keep-failed", action="store_true",
                        help="up: leave what started running when a later step fails")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="cluster: %(message)s")
    try:
        if opts.what != "build":
            from . import cluster  # the rest needs the project's environment
        if opts.what == "build":
            for name, path in sorted(build.build_all().items()):
                print(f"{name:28} {path}")
        elif opts.what == "up":
            up = cluster.up(chart=not opts.no_chart, keep_failed=opts.keep_failed)
            print(f"cluster {up.id} is up: kubectl --kubeconfig {up.kubeconfig} get nodes")
        elif opts.what == "down":
            cluster.down()
            print("cluster down: nothing of it runs")
        else:
            running = cluster.current()
            if running is None:
                print("no cluster")
                return 1
            print(json.dumps({**running.to_json(), "healthy": running.healthy()}, indent=1))
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
