"""The capture file of a replayed step (``resumequal zoom``): its format, shared by the
replay that writes it and the comparison that reads it.

``rank-<r>.pt`` (``torch.save``, read back with ``weights_only``) holds ``format``,
``step``, ``rank``, ``calls`` (per module call in execution order: ``module``, ``phase``
``forward`` or ``backward``, ``microstep``, ``call``, ``inputs`` and ``outputs`` as lists
of tensors or None; a backward call's inputs are the gradients that reach the module's
outputs, its outputs the gradients it sends to its inputs), ``stages`` (name -> tensor
name -> tensor: see :data:`STAGES`), ``buckets`` (the DDP bucket layout) and
``module_params`` (module -> its own parameters' names).
"""

from __future__ import annotations

from typing import Final

from resumequal.spec.boundaries import TABLE

CAPTURE_FORMAT: Final = 1
# The path a capture gives the model itself (named_modules' "").
ROOT: Final = "(model)"
# The state the step begins from (params_before, optimizer_state_before).
STAGES_BEFORE: Final = tuple(b.stage_before for b in TABLE if b.stage_before is not None)
# The stages around the modules, in the order the step runs them.
STAGES: Final = STAGES_BEFORE + tuple(b.stage for b in TABLE if b.stage is not None)
