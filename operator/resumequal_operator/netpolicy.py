"""The NetworkPolicies a QualificationRun creates: each leg's pods, and its zoom Job's pod,
admit connections only from their own group.

Why: every rank of a leg talks to the c10d rendezvous store on node 0 and to the worker
group's TCPStore, and torch's stores and elastic agents unpickle what they are sent; a
pod that can reach a leg's pods can run code in them (with the run's ServiceAccount, store
credentials and checkpoint key). The zoom Job replays both legs with torchrun in its one
pod, whose stores listen the same way. Nothing else connects to these pods: the operator
talks only to the API server and the store, and the comparator connects to nothing.

Why the operator and not the chart: a policy selects pods by fixed label values, so "only
from the same leg" is one policy per leg (the leg's run uid and name are its selector).
A policy the chart could ship would admit every leg of every run in the namespace into
every other, and whoever may create a QualificationRun chooses the image its legs run.

Each policy is owned by the run (the garbage collector deletes it with the run) and
selects the pods by the labels they already carry (:func:`.pytorchjob.labels`, on every
pod of a PyTorchJob or TrainJob leg). Egress is left open: pods reach the store, DNS and
their peers, which admit them.

Pure functions, no I/O.
"""

from __future__ import annotations

from typing import Any

from resumequal_operator import pytorchjob

Obj = dict[str, Any]
API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
COMPONENT = "network-policy"


def _policy(name: str, namespace: str, run_name: str, uid: str, selector: dict[str, str],
            leg: str | None = None) -> Obj:
    meta_labels = pytorchjob.labels(run_name, uid, leg) | {pytorchjob.COMPONENT: COMPONENT}
    policy: Obj = {
        "podSelector": {"matchLabels": dict(selector)},
        # Ingress only: a policy that names Ingress isolates the pods it selects for
        # ingress; the rule below is then all they admit.
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": dict(selector)}}]}],
    }
    return pytorchjob.owned_object(API_VERSION, KIND, name, namespace, run_name, uid,
                                   meta_labels, policy)


def leg_selector(uid: str, leg: str) -> dict[str, str]:
    """The labels of one leg's pods, and of no other pod the operator starts."""
    return {pytorchjob.UID_LABEL: uid, pytorchjob.LEG_LABEL: leg}


def leg_network_policy(run_name: str, namespace: str, uid: str, leg: str) -> Obj:
    """The policy of one leg, named as its job: ingress only from the leg's own pods."""
    return _policy(pytorchjob.leg_job_name(run_name, uid, leg), namespace, run_name, uid,
                   leg_selector(uid, leg), leg)


def zoom_network_policy(run_name: str, namespace: str, uid: str) -> Obj:
    """The policy of the zoom Job's pod, named as the Job: ingress only from itself."""
    selector = {pytorchjob.UID_LABEL: uid, pytorchjob.COMPONENT: "zoom"}
    return _policy(pytorchjob.zoom_job_name(run_name, uid), namespace, run_name, uid,
                   selector)


__all__ = ["API_VERSION", "KIND", "leg_network_policy", "leg_selector",
           "zoom_network_policy"]
