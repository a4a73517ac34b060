"""Trace digests, records, and the writer/reader."""

from __future__ import annotations

import json
import logging
import math
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from resumequal.errors import TraceError
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.store.log import FileSink
from resumequal.trace.digest import (
    DIGEST_ALGORITHM,
    bucket_layout_digest,
    named_tensors_digest,
    optimizer_state_digest,
    rng_digests,
    tensor_digest,
    value_digest,
)
from resumequal.trace.inventory import collect_inventory
from resumequal.trace.records import (
    BOUNDARY_FIELDS,
    ArmRecord,
    BucketRecord,
    InventoryRecord,
    LossScaleRecord,
    MicrostepPartial,
    MicrostepRecord,
    RestoreRecord,
    StepPartial,
    StepRecord,
    TraceRecord,
    TraceWriter,
    boundary_value,
    effective_steps,
    read_trace,
)

# -------------------------------------------------------------------- tensor digests


def _flip_bit(t: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    out = t.clone()
    out.view(torch.int32).view(-1)[index] ^= 1 << bit
    return out


def test_digest_names_its_algorithm(each_digest_algorithm: str) -> None:
    assert tensor_digest(torch.zeros(3)).startswith(f"{each_digest_algorithm}:")


def test_traces_that_name_no_algorithm_were_digested_with_xxh3() -> None:
    assert DIGEST_ALGORITHM == "xxh3_128"


@pytest.mark.parametrize("bit", [0, 22, 31])
@pytest.mark.usefixtures("each_digest_algorithm")
def test_one_flipped_bit_changes_the_digest(bit: int) -> None:
    t = torch.randn(1000)
    assert tensor_digest(_flip_bit(t, 517, bit)) != tensor_digest(t)


@pytest.mark.usefixtures("each_digest_algorithm")
def test_negative_zero_differs_from_zero() -> None:
    assert torch.equal(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert tensor_digest(torch.tensor([-0.0])) != tensor_digest(torch.tensor([0.0]))


@pytest.mark.usefixtures("each_digest_algorithm")
def test_nan_payloads_differ() -> None:
    quiet = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    payload = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert quiet.isnan().all() and payload.isnan().all()
    assert tensor_digest(quiet) != tensor_digest(payload)


@pytest.mark.usefixtures("each_digest_algorithm")
def test_dtype_is_part_of_the_digest() -> None:
    t = torch.randn(16)
    same_bytes = t.view(torch.int32)
    assert tensor_digest(t) != tensor_digest(same_bytes)
    assert tensor_digest(torch.zeros(4)) != tensor_digest(torch.zeros(4, dtype=torch.float64))


@pytest.mark.usefixtures("each_digest_algorithm")
def test_shape_is_part_of_the_digest() -> None:
    t = torch.randn(12)
    assert tensor_digest(t) != tensor_digest(t.view(3, 4))
    assert tensor_digest(t.view(3, 4)) != tensor_digest(t.view(4, 3))
    assert tensor_digest(torch.tensor(1.0)) != tensor_digest(torch.tensor([1.0]))


@pytest.mark.usefixtures("each_digest_algorithm")
def test_same_tensor_same_digest() -> None:
    t = torch.randn(64, 32)
    assert tensor_digest(t) == tensor_digest(t)
    assert tensor_digest(t) == tensor_digest(t.clone())


@pytest.mark.usefixtures("each_digest_algorithm")
def test_non_contiguous_views_match_contiguous_copies() -> None:
    base = torch.randn(8, 6)
    for view in (base.t(), base[:, 1:4], base[::2], base[3:]):
        assert tensor_digest(view) == tensor_digest(view.contiguous().clone())


@pytest.mark.usefixtures("each_digest_algorithm")
def test_lazy_conjugate_and_negative_views_digest_their_values() -> None:
    z = torch.randn(5, dtype=torch.complex64)
    assert tensor_digest(z.conj()) == tensor_digest(z.conj().resolve_conj())
    assert tensor_digest(z.conj()) != tensor_digest(z)


@pytest.mark.usefixtures("each_digest_algorithm")
def test_dtypes_without_a_numpy_equivalent_are_digested() -> None:
    t = torch.randn(10).to(torch.bfloat16)
    assert tensor_digest(t) != tensor_digest(_flip_bit(t.float(), 0, 31).to(torch.bfloat16))
    assert tensor_digest(torch.tensor([True, False])) != tensor_digest(torch.tensor([True, True]))


@pytest.mark.usefixtures("each_digest_algorithm")
def test_requires_grad_tensors_are_digested() -> None:
    p = torch.nn.Parameter(torch.randn(3))
    assert tensor_digest(p) == tensor_digest(p.detach().clone())


# -------------------------------------------------------------------- named digests


@pytest.mark.usefixtures("each_digest_algorithm")
def test_a_mapping_digests_by_its_keys_in_sorted_order_whatever_it_was_built_in() -> None:
    t = torch.arange(4.0)
    forward = value_digest({"exp_avg": t, "step": torch.tensor(3.0)})
    # Digested twice: the second feed of these keys comes from the cache of key feeds.
    assert value_digest({"step": torch.tensor(3.0), "exp_avg": t}) == forward
    assert value_digest({"step": torch.tensor(3.0), "exp_avg": t}) == forward
    assert value_digest({"exp_avg": t, "step": torch.tensor(4.0)}) != forward


@pytest.mark.usefixtures("each_digest_algorithm")
def test_keys_that_compare_equal_across_types_still_digest_apart() -> None:
    # 1 == True == 1.0 and they hash alike, but their reprs differ: so must the digests.
    digests = {value_digest({key: 0}) for key in (1, True, 1.0, "1")}
    assert len(digests) == 4
    assert value_digest({1: 0}) == value_digest({1: 0})


@pytest.mark.usefixtures("each_digest_algorithm")
def test_name_and_order_are_part_of_named_digest() -> None:
    a, b = torch.randn(3), torch.randn(3)
    base = named_tensors_digest([("a", a), ("b", b)])
    assert named_tensors_digest([("a", a), ("b", b)]) == base
    assert named_tensors_digest([("a", a), ("c", b)]) != base
    assert named_tensors_digest([("b", b), ("a", a)]) != base
    # Swapping only the names (same tensor order) is also a change.
    assert named_tensors_digest([("b", a), ("a", b)]) != base


@pytest.mark.usefixtures("each_digest_algorithm")
def test_none_is_distinct_from_zeros_and_from_absence() -> None:
    w = torch.randn(3)
    with_none = named_tensors_digest([("w", w), ("b", None)])
    assert with_none != named_tensors_digest([("w", w), ("b", torch.zeros(0))])
    assert with_none != named_tensors_digest([("w", w), ("b", torch.zeros(3))])
    assert with_none != named_tensors_digest([("w", w)])


@pytest.mark.usefixtures("each_digest_algorithm")
def test_names_cannot_run_into_each_other() -> None:
    t = torch.zeros(1)
    assert named_tensors_digest([("ab", t), ("c", t)]) != named_tensors_digest(
        [("a", t), ("bc", t)]
    )


@pytest.mark.usefixtures("each_digest_algorithm")
def test_model_grads_with_an_unused_parameter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model(torch.randn(2, 4)).sum().backward()
    before = named_tensors_digest((n, p.grad) for n, p in model.named_parameters())
    model[1].bias.grad = None
    after = named_tensors_digest((n, p.grad) for n, p in model.named_parameters())
    assert before != after


# -------------------------------------------------------------------- optimizer digests


def _trained(lr: float, steps: int) -> torch.optim.Optimizer:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(2, 4)).square().sum().backward()
        opt.step()
    return opt


@pytest.mark.usefixtures("each_digest_algorithm")
def test_optimizer_digest_is_reproducible() -> None:
    assert optimizer_state_digest(_trained(1e-3, 2)) == optimizer_state_digest(_trained(1e-3, 2))


@pytest.mark.usefixtures("each_digest_algorithm")
def test_optimizer_digest_sees_state_and_hyperparameters() -> None:
    base = optimizer_state_digest(_trained(1e-3, 2))
    assert optimizer_state_digest(_trained(1e-3, 3)) != base
    opt = _trained(1e-3, 2)
    opt.param_groups[0]["weight_decay"] = 0.01 * (1 + 2**-40)
    assert optimizer_state_digest(opt) != base


@pytest.mark.usefixtures("each_digest_algorithm")
def test_optimizer_digest_leaves_lr_to_its_own_boundary() -> None:
    opt = _trained(1e-3, 2)
    base = optimizer_state_digest(opt)
    opt.param_groups[0]["lr"] = 5e-4
    assert optimizer_state_digest(opt) == base


@pytest.mark.usefixtures("each_digest_algorithm")
def test_optimizer_digest_sees_one_bit_of_a_moment() -> None:
    opt = _trained(1e-3, 2)
    base = optimizer_state_digest(opt)
    exp_avg = opt.state[opt.param_groups[0]["params"][0]]["exp_avg"]
    exp_avg.view(torch.int32).view(-1)[0] ^= 1
    assert optimizer_state_digest(opt) != base


# -------------------------------------------------------------------- rng digests


@pytest.mark.parametrize(
    ("key", "advance"),
    [
        ("python", lambda: random.random()),
        ("numpy", lambda: np.random.rand()),
        ("torch", lambda: torch.rand(1)),
    ],
)
@pytest.mark.usefixtures("each_digest_algorithm")
def test_rng_digest_changes_when_its_rng_advances(key: str, advance: object) -> None:
    before = rng_digests()
    assert set(before) >= {"python", "numpy", "torch"}
    assert rng_digests() == before
    advance()  # type: ignore[operator]
    after = rng_digests()
    assert after[key] != before[key]
    assert {k: v for k, v in after.items() if k != key} == {
        k: v for k, v in before.items() if k != key
    }


@pytest.mark.usefixtures("each_digest_algorithm")
def test_rng_digests_follow_seeding() -> None:
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    first = rng_digests()
    random.random()
    np.random.rand()
    torch.rand(1)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    assert rng_digests() == first


@pytest.mark.usefixtures("each_digest_algorithm")
def test_numpy_gaussian_cache_is_seen() -> None:
    np.random.seed(3)
    np.random.standard_normal()  # draws two, caches one
    cached = rng_digests()["numpy"]
    np.random.seed(3)
    np.random.standard_normal()
    state: Any = np.random.get_state()
    np.random.set_state((*state[:3], 0, 0.0))  # same words, no cached gaussian
    assert rng_digests()["numpy"] != cached


# -------------------------------------------------------------------- records and files


def _step(rank: int = 0, attempt: int = 0, step: int = 1, loss: float = 1.25) -> StepRecord:
    buckets = [BucketRecord(index=0, params=["b", "w"], numel=12)]
    return StepRecord(
        rank=rank,
        attempt=attempt,
        step=step,
        microsteps=[
            MicrostepRecord(index=0, sample_ids=[3, 1], loss=loss),
            MicrostepRecord(index=1, sample_ids=[4, 0], loss=0.1),
        ],
        rng={"python": "xxh3_128:00", "torch": "xxh3_128:01"},
        local_grads="xxh3_128:02",
        bucket_layout=bucket_layout_digest(buckets),
        buckets=buckets,
        reduced_grads="xxh3_128:03",
        clipped_grads="xxh3_128:06",
        grad_norm=0.7,
        lr=[3e-3, 1e-4],
        params="xxh3_128:04",
        optimizer_state="xxh3_128:05",
        started_at=1700000000.123456,
        finished_at=1700000000.5,
    )


EXACT_FLOATS = [
    0.1,
    1 / 3,
    -0.0,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    float(np.float32(0.1)),
    math.pi * 1e-300,
    float(torch.randn(1, generator=torch.Generator().manual_seed(1)).item()),
]


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def test_round_trip_keeps_floats_bit_exact(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "rank0.jsonl"
    written = [_step(step=i + 1, loss=x) for i, x in enumerate(EXACT_FLOATS)]
    written[0] = written[0].model_copy(update={"grad_norm": 5e-324, "lr": EXACT_FLOATS})
    with TraceWriter(FileSink(path)) as writer:
        for record in written:
            writer.write(record)
    back = read_trace(path)
    assert back == written
    for w, b in zip(written, back, strict=True):
        assert isinstance(b, StepRecord)
        assert _bits(b.microsteps[0].loss) == _bits(w.microsteps[0].loss)
    first = back[0]
    assert isinstance(first, StepRecord)
    assert [_bits(x) for x in first.lr] == [_bits(x) for x in EXACT_FLOATS]


def test_random_float_bit_patterns_round_trip(tmp_path: Path) -> None:
    rng = random.Random(0)
    values: list[float] = []
    while len(values) < 2000:
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(x):
            values.append(x)
    path = tmp_path / "t.jsonl"
    with TraceWriter(FileSink(path)) as writer:
        writer.write(_step().model_copy(update={"lr": values}))
    (back,) = read_trace(path)
    assert isinstance(back, StepRecord)
    assert [_bits(x) for x in back.lr] == [_bits(x) for x in values]


def test_nan_and_inf_are_written_as_strict_json_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record = _step(loss=float("nan")).model_copy(
        update={"grad_norm": float("inf"), "lr": [float("-inf")]}
    )
    with TraceWriter(FileSink(path)) as writer:
        writer.write(record)

    def reject(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    line = json.loads(path.read_text(), parse_constant=reject)
    assert line["microsteps"][0]["loss"] == "NaN"
    assert line["grad_norm"] == "Infinity"
    assert line["lr"] == ["-Infinity"]
    (back,) = read_trace(path)
    assert isinstance(back, StepRecord)
    assert math.isnan(back.microsteps[0].loss)
    assert back.grad_norm == float("inf")
    assert back.lr == [float("-inf")]


def test_every_record_kind_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    records: list[TraceRecord] = [
        collect_inventory(rank=1, attempt=0),
        ArmRecord(rank=1, attempt=0, step=6, microstep=1, pid=42, armed_at=1.5),
        RestoreRecord(
            rank=1,
            attempt=1,
            checkpoint="step-4",
            step=4,
            microstep=0,
            global_microstep=12,
            omitted=["rng"],
            restored_at=2.5,
        ),
        _step(rank=1, attempt=1, step=5),
    ]
    with TraceWriter(FileSink(path)) as writer:
        for record in records:
            writer.write(record)
    assert read_trace(path) == records
    assert [json.loads(line)["kind"] for line in path.read_text().splitlines()] == [
        "inventory",
        "arm",
        "restore",
        "step",
    ]


def test_writer_appends_across_reopens(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(FileSink(path)) as writer:
        writer.write(_step(step=1))
    with TraceWriter(FileSink(path)) as writer:
        writer.write(_step(attempt=1, step=2))
    assert [r.step for r in read_trace(path) if isinstance(r, StepRecord)] == [1, 2]


def test_truncated_last_line_is_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(FileSink(path)) as writer:
        writer.write(_step(step=1))
        writer.write(_step(step=2))
    text = path.read_text()
    path.write_text(text + _step(step=3).model_dump_json()[:57])
    with caplog.at_level(logging.WARNING, logger="resumequal.trace.records"):
        back = read_trace(path)
    assert [r.step for r in back if isinstance(r, StepRecord)] == [1, 2]
    assert any("partial last line" in m for m in caplog.messages)


def test_unterminated_but_complete_last_line_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_step(step=1).model_dump_json() + "\n" + _step(step=2).model_dump_json())
    assert [r.step for r in read_trace(path) if isinstance(r, StepRecord)] == [1, 2]


def test_reopening_after_a_torn_write_drops_the_partial_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(FileSink(path)) as writer:
        writer.write(_step(step=1))
    with path.open("a") as f:
        f.write(_step(step=2).model_dump_json()[:100])
    with caplog.at_level(logging.WARNING, logger="resumequal.store.log"), \
            TraceWriter(FileSink(path)) as w:
        w.write(_step(attempt=1, step=2))
    assert any("partial last line" in m for m in caplog.messages)
    back = read_trace(path)
    assert [(r.attempt, r.step) for r in back if isinstance(r, StepRecord)] == [(0, 1), (1, 2)]


def test_reopening_a_file_that_is_only_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"kind": "st')
    with TraceWriter(FileSink(path)) as writer:
        writer.write(_step(step=1))
    assert len(read_trace(path)) == 1


def test_corrupt_middle_line_raises_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [_step(step=i).model_dump_json() for i in (1, 2, 3)]
    lines[1] = lines[1][:40]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf"{path.name}:2: "):
        read_trace(path)


def test_terminated_bad_last_line_is_not_forgiven(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_step(step=1).model_dump_json() + "\n" + '{"kind": "step"}\n')
    with pytest.raises(TraceError, match=r":2: "):
        read_trace(path)


def test_unknown_kind_and_extra_fields_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"kind": "bogus"}\n')
    with pytest.raises(TraceError, match=":1: "):
        read_trace(path)
    line = json.loads(_step().model_dump_json())
    line["surprise"] = 1
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(TraceError, match="surprise"):
        read_trace(path)


def test_missing_trace_raises_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.jsonl")


def test_a_step_partial_holds_fields_of_its_step_record() -> None:
    """A step in progress is saved as plain data and finished into records later: its keys
    must stay the records' own."""
    assert set(MicrostepPartial.__annotations__) == set(MicrostepRecord.model_fields)
    assert set(StepPartial.__annotations__) <= set(StepRecord.model_fields)
    partial = StepPartial(rng={"python": "x"}, started_at=1.0, microsteps=[
        MicrostepPartial(index=0, global_index=None, sample_ids=[3, 4],
                         loss=float("nan"))])
    [micro] = [MicrostepRecord(**m) for m in partial["microsteps"]]
    assert micro.sample_ids == [3, 4] and math.isnan(micro.loss)


def test_restore_record_only_takes_known_omissions() -> None:
    with pytest.raises(ValidationError):
        RestoreRecord.model_validate(
            {
                "rank": 0,
                "attempt": 1,
                "checkpoint": "step-4",
                "step": 4,
                "microstep": 0,
                "global_microstep": 12,
                "omitted": ["everything"],
                "restored_at": 0.0,
            }
        )


def test_effective_steps_takes_the_last_record_per_step(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(FileSink(path)) as writer:
        for step in range(1, 7):
            writer.write(_step(rank=1, attempt=0, step=step, loss=float(step)))
            writer.write(_step(rank=0, attempt=0, step=step, loss=-float(step)))
        # Attempt 1 resumed from the checkpoint after step 4 and redoes 5 and 6.
        for step in range(5, 9):
            writer.write(_step(rank=1, attempt=1, step=step, loss=10.0 + step))
    steps = effective_steps(read_trace(path), rank=1)
    assert list(steps) == list(range(1, 9))
    assert [steps[s].attempt for s in steps] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert steps[5].microsteps[0].loss == 15.0
    assert all(r.rank == 0 for r in effective_steps(read_trace(path), rank=0).values())
    assert effective_steps(read_trace(path), rank=2) == {}


# -------------------------------------------------------------------- inventory


def test_inventory_keeps_relevant_env_and_drops_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")
    monkeypatch.setenv("TORCH_HUB_TOKEN", "hunter2")
    monkeypatch.setenv("NCCL_API_KEY", "hunter2")
    monkeypatch.setenv("CUDA_secret_path", "hunter2")
    monkeypatch.setenv("GLOO_PASSWORD", "hunter2")
    monkeypatch.setenv("TORCH_CREDENTIALS_FILE", "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("UNRELATED_SETTING", "x")
    inv = collect_inventory(rank=1, attempt=2)
    assert inv.env["NCCL_DEBUG"] == "INFO"
    assert inv.env["OMP_NUM_THREADS"] == "1"
    assert inv.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert inv.env["TORCH_SHOW_CPP_STACKTRACES"] == "1"
    assert "UNRELATED_SETTING" not in inv.env
    assert "hunter2" not in inv.model_dump_json()
    for name in inv.env:
        assert not any(m in name.upper() for m in ("KEY", "SECRET", "TOKEN", "PASSWORD", "CRED"))


def test_inventory_describes_this_process() -> None:
    inv = collect_inventory(rank=1, attempt=2)
    assert (inv.rank, inv.attempt) == (1, 2)
    assert inv.torch == torch.__version__
    assert inv.numpy == np.__version__
    assert inv.num_threads == torch.get_num_threads()
    assert inv.deterministic_algorithms == torch.are_deterministic_algorithms_enabled()


def test_comparable_drops_per_process_fields() -> None:
    a = collect_inventory(rank=0, attempt=0)
    b = a.model_copy(update={"rank": 1, "attempt": 3, "pid": a.pid + 1, "host": "elsewhere"})
    assert a.comparable() == b.comparable()
    assert not {"pid", "host", "rank", "attempt"} & set(a.comparable())
    c = a.model_copy(update={"num_threads": a.num_threads + 1})
    assert a.comparable() != c.comparable()


def test_inventory_rejects_unknown_fields() -> None:
    data = collect_inventory(rank=0, attempt=0).model_dump()
    data["extra"] = 1
    with pytest.raises(ValidationError):
        InventoryRecord.model_validate(data)


# -------------------------------------------------------------------- boundaries


def test_boundary_fields_cover_exactly_the_spec_boundaries() -> None:
    assert set(BOUNDARY_FIELDS) == set(BOUNDARIES)
    assert set(BOUNDARY_FIELDS.values()) <= set(StepRecord.model_fields)


def test_boundary_values() -> None:
    record = _step(loss=2.5)
    assert boundary_value(record, "inputs") == [[3, 1], [4, 0]]
    assert boundary_value(record, "loss") == [2.5, 0.1]
    assert boundary_value(record, "rng") == record.rng
    assert boundary_value(record, "lr") == [3e-3, 1e-4]
    assert boundary_value(record, "grad_norm") == 0.7
    # Without a loss scaler (fp32, bf16) the loss_scale boundary is None on both legs.
    assert boundary_value(record, "loss_scale") is None
    scaled = record.model_copy(update={"loss_scale": LossScaleRecord(scale=2.0, growth_tracker=1)})
    assert boundary_value(scaled, "loss_scale") == {"scale": 2.0, "growth_tracker": 1}
    for boundary in BOUNDARIES:
        assert boundary_value(scaled, boundary) is not None
    with pytest.raises(ValueError, match="unknown boundary"):
        boundary_value(record, "vibes")


def test_bucket_layout_digest_sees_order_and_membership() -> None:
    a = BucketRecord(index=0, params=["w", "b"], numel=10)
    b = BucketRecord(index=1, params=["v"], numel=4)
    base = bucket_layout_digest([a, b])
    assert bucket_layout_digest([a, b]) == base
    assert bucket_layout_digest([b, a]) != base
    assert bucket_layout_digest([a.model_copy(update={"params": ["b", "w"]}), b]) != base
    assert bucket_layout_digest([a.model_copy(update={"params": ["w", "b", "v"]})]) != base


def test_file_sink_ends_every_line(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "t.jsonl")
    sink.append(b'{"a": 1}')
    sink.append(b'{"b": 2}\n')
    sink.close()
    assert (tmp_path / "t.jsonl").read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    with pytest.raises(ValueError, match="closed trace"):
        sink.append(b"{}")
