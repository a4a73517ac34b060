"""What a QualificationRun needs of its image's torch, judged before anything is created.

The operator cannot import the image's torch; ``stack.torchVersion`` says which it is, and
:mod:`resumequal.spec.capabilities` which features that release lacks. A run whose spec needs
one is refused (``NotSupported``) naming the feature, its field and the first torch that
has it. Without ``stack.torchVersion`` nothing is judged here: the legs refuse it when they
start.

Must not: talk to the cluster or the store, or import torch.
"""

from __future__ import annotations

from resumequal.spec.capabilities import TorchInfo, missing_features, refusal
from resumequal_operator.resource import QualificationRunSpec
from resumequal_operator.validation import Problem, qualification_spec


def unsupported(spec: QualificationRunSpec) -> list[Problem]:
    """One problem per feature ``spec`` needs that its ``stack.torchVersion`` lacks."""
    version = spec.stack.torch_version
    if version is None:
        return []
    torch = TorchInfo.of_version(version)
    qspec = qualification_spec(spec)
    return [Problem(path="spec.stack.torchVersion", message=refusal(f, qspec, torch))
            for f in missing_features(qspec, torch)]
