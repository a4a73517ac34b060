"""Per-tensor digests: each tensor's digest, the whole boundary's derived from them, the
optimizer's state per parameter; and which tensors differ when a boundary differs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from resumequal.compare.tensors import module_of, tensor_difference
from resumequal.trace import digest
from resumequal.trace.digest import (
    NO_TENSOR,
    PARAM_GROUPS,
    combined_digest,
    optimizer_digests,
    tensor_digests,
)
from resumequal.trace.records import StepRecord, TensorDigests

pytestmark = pytest.mark.usefixtures("each_digest_algorithm")


def test_each_tensor_gets_its_digest_and_the_whole_follows_from_them() -> None:
    a, b = torch.arange(4.0), torch.ones(2, 2)
    d = tensor_digests([("a", a), ("b", b), ("c", None)])
    assert list(d.tensors) == ["a", "b", "c"] and d.tensors["c"] == NO_TENSOR
    assert d.whole == combined_digest(d.tensors) and d.whole.startswith(f"{digest.used()}:")
    # One changed bit changes that tensor's digest, and the whole, and nothing else.
    flipped = a.clone()
    flipped.view(torch.int32)[1] ^= 1
    e = tensor_digests([("a", flipped), ("b", b), ("c", None)])
    assert e.tensors["a"] != d.tensors["a"] and e.tensors["b"] == d.tensors["b"]
    assert e.whole != d.whole
    # Order and names are part of the whole.
    assert tensor_digests([("b", b), ("a", a), ("c", None)]).whole != d.whole
    assert tensor_digests([("a", a), ("x", b), ("c", None)]).whole != d.whole
    # A missing tensor differs from an empty one.
    assert tensor_digests([("c", torch.zeros(0))]).tensors["c"] != NO_TENSOR


def _stepped(lr: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt


def test_the_optimizer_state_is_digested_per_parameter_by_name() -> None:
    model, opt = _stepped(1e-3)
    names = {id(p): n for n, p in model.named_parameters()}
    d = optimizer_digests(opt, names)
    assert list(d.tensors) == ["0.weight", "0.bias", "1.weight", "1.bias", PARAM_GROUPS]
    again_model, again = _stepped(1e-3)
    assert optimizer_digests(again, {id(p): n for n, p in again_model.named_parameters()}) == d
    # Another lr moves every moment, not the param groups' digest (the lr is left out).
    other_model, other = _stepped(2e-3)
    e = optimizer_digests(other, {id(p): n for n, p in other_model.named_parameters()})
    assert e.tensors[PARAM_GROUPS] == d.tensors[PARAM_GROUPS]
    # A weight decay does change it.
    other.param_groups[0]["weight_decay"] = 0.5
    f = optimizer_digests(other, {id(p): n for n, p in other_model.named_parameters()})
    assert f.tensors[PARAM_GROUPS] != e.tensors[PARAM_GROUPS]


def _record(**tensors: dict[str, str]) -> StepRecord:
    return StepRecord(rank=0, attempt=0, step=3, microsteps=[], rng={}, local_grads="x",
                      reduced_grads="x", grad_norm=1.0, lr=[0.1], params="x",
                      optimizer_state="x", started_at=0.0, finished_at=1.0,
                      tensors=TensorDigests(**tensors))


def test_differing_gradients_are_named_in_backward_order_and_grouped_by_module() -> None:
    names = ["embed.weight", "layers.0.attn.weight", "layers.0.attn.bias",
             "layers.1.attn.weight", "layers.1.attn.bias", "head.weight"]
    control = {n: f"{i:032x}" for i, n in enumerate(names)}
    preempted = dict(control, **{"layers.0.attn.weight": "f" * 32, "layers.1.attn.bias": "e" * 32})
    t = tensor_difference("reduced_grads", _record(reduced_grads=control),
                          _record(reduced_grads=preempted))
    assert t is not None and (t.total, t.differ, t.order) == (6, 2, "backward")
    # Backward order: the gradient nearest the loss first.
    assert t.first == "layers.1.attn.bias"
    assert t.differing == ["layers.1.attn.bias", "layers.0.attn.weight"]
    by_module = {m.module: (m.differ, m.total) for m in t.modules}
    assert by_module == {"head": (0, 1), "layers.1.attn": (1, 2), "layers.0.attn": (1, 2),
                         "embed": (0, 1)}
    # Parameters read in the model's order; a tensor one leg lacks differs.
    p = tensor_difference("params", _record(params=control),
                          _record(params={**preempted, "extra.weight": "0" * 32}))
    assert p is not None and p.order == "parameter" and p.first == "layers.0.attn.weight"
    assert p.differing[-1] == "extra.weight" and p.total == 7


def test_boundaries_without_per_tensor_digests_name_no_tensors() -> None:
    digests = {"w": "0" * 32}
    a, b = _record(params=digests), _record(params=digests)
    assert tensor_difference("loss", a, b) is None
    assert tensor_difference("reduced_grads", a, b) is None  # recorded for none of them
    old = a.model_copy(update={"tensors": None})
    assert tensor_difference("params", old, b) is None
    same = tensor_difference("params", a, b)
    assert same is not None and same.differ == 0 and same.first is None


def test_modules_are_names_without_their_last_part() -> None:
    assert module_of("layers.22.attn.in_proj_a.weight") == "layers.22.attn.in_proj_a"
    assert module_of("param_groups") == "(model)"


def test_a_divergence_without_tensors_of_its_own_names_where_the_step_spreads() -> None:
    from resumequal.compare.tensors import bucket_layouts, step_tensors
    from resumequal.results.verdict import Divergence
    from resumequal.trace.records import BucketRecord

    grads = {f"l{i}.weight": f"{i:032x}" for i in range(4)}
    a = _record(local_grads=grads, reduced_grads=grads, params=grads).model_copy(update={
        "bucket_layout": "x1", "buckets": [BucketRecord(index=0, params=list(grads), numel=8)]})
    b = _record(local_grads=grads, reduced_grads=dict(grads, **{"l2.weight": "f" * 32}),
                params=grads).model_copy(update={
        "bucket_layout": "x2", "buckets": [BucketRecord(index=i, params=[n], numel=2)
                                           for i, n in enumerate(grads)]})
    spread = step_tensors(a, b)
    assert list(spread) == ["local_grads", "reduced_grads", "params"]
    assert [(t.differ, t.total) for t in spread.values()] == [(0, 4), (1, 4), (0, 4)]
    layouts = bucket_layouts(a, b)
    assert layouts is not None and [len(layouts[k]) for k in ("control", "preempted")] == [1, 4]
    assert bucket_layouts(a, a) is None
    div = Divergence(step=3, boundary="bucket_layout", rank=0, control="1 bucket",
                     preempted="4 buckets", before_cut=False, step_tensors=spread,
                     buckets=layouts)
    assert div.tensor_words() == ""
    assert div.spread_words() == \
        "reduced_grads: 1 of 4 tensors differ (first in backward order: l2.weight)"
    same = div.model_copy(update={"step_tensors": step_tensors(a, a)})
    assert same.spread_words() == ""
    # A boundary with tensors of its own names them, not the spread.
    own = div.model_copy(update={"boundary": "reduced_grads",
                                 "tensors": spread["reduced_grads"]})
    assert own.tensor_words().startswith("1 of 4") and own.spread_words() == ""
