"""Other people's systems as the tests and the benches run them: a Kubernetes cluster
built from source on this machine (testing/cluster), its node agent standing in for the
kubelet.

Owns: starting them, the ports their servers and the tests' listen on (``ports``), and
what stands in for upstream (the node agent, the scripted containers), each rule naming
the upstream source it follows. Must not: be imported by the
product (service/, operator/), nor hold tests of its own (those are under tests/).
"""
