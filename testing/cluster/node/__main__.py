"""``python -m testing.cluster.node``: run the node agent until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from kubernetes import client, config

from ..build import KUBERNETES, TRAINING_OPERATOR, binaries_dir
from ..network import Bridge
from .agent import API_CONNECTIONS, NodeAgent, machine_capacity
from .images import cluster_images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--bridge", required=True)
    parser.add_argument("--subnet", required=True)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--api-host", required=True)
    parser.add_argument("--api-port", required=True, type=int)
    parser.add_argument("--dns-ip", required=True)
    parser.add_argument("--netns-prefix", required=True)
    parser.add_argument("--cpus", default="16")
    parser.add_argument("--memory", default="64Gi")
    parser.add_argument("--image-alias", action="append", default=[], metavar="REPO=IMAGE",
                        help="hold IMAGE under the repository REPO too (repeatable)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(opts.kubeconfig),
                            client_configuration=configuration)
    configuration.connection_pool_maxsize = API_CONNECTIONS
    binaries = {name: binaries_dir(module) / name for module in (KUBERNETES, TRAINING_OPERATOR)
                for name, _ in module.programs}
    capacity = {**machine_capacity(), "cpu": opts.cpus, "memory": opts.memory}
    images = cluster_images(binaries, dict(a.split("=", 1) for a in opts.image_alias))
    images.loaded = opts.root / "images"  # what cluster.load_image loads
    agent = NodeAgent(client.ApiClient(configuration), name=opts.name,
                      bridge=Bridge(opts.bridge, opts.subnet),
                      images=images,
                      root=opts.root, api_host=opts.api_host, api_port=opts.api_port,
                      dns_ip=opts.dns_ip, capacity=capacity, netns_prefix=opts.netns_prefix)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
