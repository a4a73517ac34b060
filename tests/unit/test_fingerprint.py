"""wsum128, the fingerprint computed where a tensor lives: the same bits as a plain-integer
reference whatever the path (packed with small tensors, read in place, compiled), and
sensitive to every single-bit flip, to permutations, signed zeros and NaN payloads."""

from __future__ import annotations

import itertools

import pytest
import torch

from resumequal.trace import digest, fingerprint
from resumequal.trace.fingerprint import PACK_BYTES, ROW_WORDS, fingerprints, reference
from resumequal.trace.records import InventoryRecord


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _flipped(t: torch.Tensor, bit: int) -> torch.Tensor:
    out = t.clone()
    raw = out.reshape(-1).view(torch.uint8)
    raw[bit // 8] ^= 1 << (bit % 8)
    return out


@pytest.mark.parametrize("numel", [0, 1, 3, ROW_WORDS - 1, ROW_WORDS, 3 * ROW_WORDS + 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool,
                                   torch.float64, torch.complex64])
def test_matches_the_plain_integer_reference(numel: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(numel)
    t = (torch.randn(numel, generator=g) * 100).to(dtype)
    assert fingerprints([t]) == [reference(_bytes(t))]


def test_tensors_read_in_place_and_packed_together_match_the_reference() -> None:
    g = torch.Generator().manual_seed(1)
    # Large ones are read where they lie (their last partial row packed with the small).
    sizes = [5, PACK_BYTES // 4 + 333, 0, ROW_WORDS, 3 * PACK_BYTES // 4, 17]
    tensors = [torch.randn(n, generator=g) for n in sizes]
    tensors.append(torch.arange(9, dtype=torch.int16)[1:])  # not 4-aligned in its storage
    assert fingerprints(tensors) == [reference(_bytes(t)) for t in tensors]
    # A tensor's fingerprint does not depend on what it is batched with.
    assert [fingerprints([t])[0] for t in tensors] == fingerprints(tensors)


def test_the_compiled_reduction_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(2)
    tensors = [torch.randn(n, generator=g) for n in (7, PACK_BYTES // 4 + 1, 4 * ROW_WORDS)]
    plain = fingerprints(tensors)
    monkeypatch.setenv(fingerprint.COMPILE_ENV, "1")
    assert fingerprints(tensors) == plain


def test_every_single_bit_flip_changes_it() -> None:
    g = torch.Generator().manual_seed(3)
    for t in (torch.randn(40, generator=g), torch.randn(33, generator=g).to(torch.bfloat16)):
        bits = t.numel() * t.element_size() * 8
        seen = {fingerprints([t])[0]}
        seen |= set(fingerprints([_flipped(t, bit) for bit in range(bits)]))
        assert len(seen) == bits + 1
    # A sample of bits of a tensor read in place, the top bit of each word among them.
    big = torch.randn(PACK_BYTES // 4 + 2 * ROW_WORDS, generator=g)
    sampled = torch.randint(0, 8 * big.nbytes, (64,), generator=g).tolist()
    bits = [31, 63, 8 * big.nbytes - 1, *sampled]
    seen = {fingerprints([big])[0]} | set(fingerprints([_flipped(big, b) for b in bits]))
    assert len(seen) == len(set(bits)) + 1


def test_flipped_signs_never_cancel() -> None:
    # Two flipped sign bits would cancel in a sum of 64-bit words times odd multipliers
    # (2**63 + 2**63 = 2**64); in 32-bit words they cannot.
    t = torch.ones(2 * ROW_WORDS + 3)
    base = fingerprints([t])[0]
    for i, j in [(0, 1), (1, 3), (5, ROW_WORDS + 5), (0, 2 * ROW_WORDS + 2)]:
        neg = t.clone()
        neg[[i, j]] *= -1
        assert fingerprints([neg])[0] != base, (i, j)


def test_permutations_are_told_apart() -> None:
    g = torch.Generator().manual_seed(4)
    t = torch.randn(1000, generator=g).to(torch.float16)
    perms = [t[torch.randperm(t.numel(), generator=g)] for _ in range(50)]
    swaps = []
    for i, j in itertools.combinations(range(0, 1000, 97), 2):
        s = t.clone()
        s[[i, j]] = s[[j, i]]
        swaps.append(s)
    prints = fingerprints([t, t.flip(0), *perms, *swaps])
    assert len(set(prints)) == len(prints)


def test_signed_zeros_and_nan_payloads_are_told_apart() -> None:
    zeros = [torch.tensor([0.0]), torch.tensor([-0.0])]
    nans = [torch.tensor([bits], dtype=torch.int32).view(torch.float32)
            for bits in (0x7FC00000, 0x7FC00001, 0x7FA00000, -0x400000)]
    assert all(n.isnan().all() for n in nans)
    prints = fingerprints(zeros + nans)
    assert len(set(prints)) == len(prints)


@pytest.mark.usefixtures("single_process_group")
def test_a_shard_is_digested_with_its_sharding_under_wsum128() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    full = torch.arange(16.0).reshape(4, 4)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    digest.use("wsum128")
    try:
        assert digest.tensor_digest(sharded) != digest.tensor_digest(sharded.to_local())
        assert digest.tensor_digest(sharded.to_local()) == digest.tensor_digest(full)
        assert digest.tensor_digest(sharded).startswith("wsum128:")
    finally:
        digest.use(digest.DIGEST_ALGORITHM)


def test_batched_digests_equal_digests_taken_one_at_a_time(each_digest_algorithm: str) -> None:
    g = torch.Generator().manual_seed(5)
    items = [(f"t{i}", torch.randn(n, generator=g)) for i, n in enumerate((3, 5000, 1))]
    alone = [digest.named_tensors_digest([item]) for item in items]
    with digest.batched(t for _, t in items):
        assert [digest.named_tensors_digest([item]) for item in items] == alone
    assert digest.tensor_digests(items).tensors == digest.tensor_digests(
        [(n, t.clone()) for n, t in items]).tensors


def test_the_algorithms_digest_apart_and_an_unknown_one_is_refused() -> None:
    t = torch.randn(10)
    digest.use("wsum128")
    try:
        wsum = digest.tensor_digest(t)
    finally:
        digest.use(digest.DIGEST_ALGORITHM)
    assert wsum.startswith("wsum128:") and wsum != digest.tensor_digest(t)
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'; known: xxh3_128"):
        digest.use("md5")  # type: ignore[arg-type]


def test_legs_must_digest_alike() -> None:
    # The inventory names the algorithm, and the legs' inventories must be equal.
    fields = InventoryRecord.model_fields
    assert fields["digest"].default == "xxh3_128"
    rec = InventoryRecord.model_validate({
        "rank": 0, "attempt": 0, "pid": 1, "host": "h", "python": "3", "torch": "2",
        "cuda": None, "cudnn": None, "nccl": None, "gloo": True, "numpy": "2",
        "platform": "p", "num_threads": 1, "deterministic_algorithms": True,
        "cudnn_deterministic": False, "cudnn_benchmark": False,
        "float32_matmul_precision": "highest", "cudnn_allow_tf32": True, "env": {}})
    assert rec.digest == "xxh3_128"
    other = rec.model_copy(update={"digest": "wsum128"})
    assert rec.comparable()["digest"] != other.comparable()["digest"]
