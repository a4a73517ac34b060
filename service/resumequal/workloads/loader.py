"""LoaderStream: torchdata's ``StatefulDataLoader`` behind the :class:`StatefulDataset`
protocol the training loop uses, and the loader a built-in workload runs through.

How a batch carries its sample ids (what the ``inputs`` boundary compares):

- a tuple or list batch holds them first: the dataset returns ``(sample_id, x, y, ...)``,
  collated into ``(ids, xs, ys, ...)``; ``loss_fn`` gets ``Microbatch.data = (xs, ys, ...)``;
- a dict batch holds them under ``"sample_id"`` (``ids_key``): the dataset returns
  ``{"sample_id": i, "input_ids": ..., ...}``; ``loss_fn`` gets the dict without that key,
  ready for ``model(**data)``.

The ids are a 1-D integer tensor or a list of ints, one per sample of the batch.

State. The loop checkpoints two things per rank: this stream's cursor (``state_dict``:
the epoch, which it passes to the sampler's ``set_epoch``) as the data cursor, and the
loader's own ``state_dict`` (``loader_state_dict``: samples yielded, worker snapshots,
the workers' base seed), encoded as JSON values by :mod:`~resumequal.workloads.plainstate`.

The global RNGs. A DataLoader draws its workers' base seed from the global torch RNG (or
its ``generator``) whenever it makes an iterator: at the first batch, at every epoch
without persistent workers, and again when a resumed process makes its first one — a draw
the uninterrupted run never made at that point. The stream makes iterators (and takes the
loader's state) with the Python, NumPy and torch RNGs of the training process set back
afterwards, so loading never moves the trainer's RNG streams; on a resume the loader
restores the saved base seed. Samples loaded in the training process (``workers: 0``)
draw from the global RNGs as usual.

Workers seed their own RNGs from ``base_seed + worker id`` and torchdata does not save
them: augmentation drawn from a worker's global RNGs resumes exactly only if the dataset
is ``Stateful`` and carries them, as :class:`SampleDataset` does for the built-ins.

Must not: create process groups, read or write checkpoints, or pickle anything.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from resumequal.errors import TrainingError
from resumequal.spec import LoaderSpec
from resumequal.workloads.base import Microbatch, WorkloadContext
from resumequal.workloads.plainstate import decode, encode

__all__ = [
    "EPOCH_KEY",
    "IDS_KEY",
    "LoaderStream",
    "SampleDataset",
    "builtin_loader",
    "check_settings",
    "is_stateful_dataloader",
]

IDS_KEY = "sample_id"
EPOCH_KEY = "epoch"
_INSTALL = "pip install 'resumequal[data]'"


def _stateful_dataloader_class() -> type[DataLoader[Any]]:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as e:
        raise TrainingError(f"workload.loader needs torchdata: {_INSTALL} ({e})") from e
    cls: type[DataLoader[Any]] = StatefulDataLoader
    return cls


def is_stateful_dataloader(obj: object) -> bool:
    """Whether ``obj`` is a torchdata ``StatefulDataLoader`` (False without torchdata)."""
    if not isinstance(obj, DataLoader):
        return False
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return False
    return isinstance(obj, StatefulDataLoader)


@contextmanager
def rng_kept() -> Iterator[None]:
    """Set the Python, NumPy and torch CPU RNGs back to where they were on exit."""
    py, npy, pt = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(pt)


def split_batch(batch: Any, ids_key: str = IDS_KEY) -> Microbatch:
    """A collated batch as a :class:`Microbatch`: its sample ids and what ``loss_fn`` takes."""
    data: Any
    if isinstance(batch, Mapping):
        if ids_key not in batch:
            raise TrainingError(
                f"a dict batch must hold its sample ids under {ids_key!r}; it has "
                f"{', '.join(map(repr, batch)) or 'no keys'}"
            )
        ids, data = batch[ids_key], {k: v for k, v in batch.items() if k != ids_key}
    elif isinstance(batch, Sequence) and not isinstance(batch, str) and len(batch) >= 2:
        ids, data = batch[0], tuple(batch[1:])
    else:
        raise TrainingError(
            f"a batch must be a dict with {ids_key!r} or a tuple (sample_ids, ...); got a "
            f"{type(batch).__name__}"
        )
    return Microbatch(sample_ids=_ids(ids), data=data)


def _ids(ids: Any) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex():
            raise TrainingError(
                f"sample ids must be a 1-D integer tensor; got {ids.dtype} of shape "
                f"{tuple(ids.shape)}"
            )
        return [int(i) for i in ids.tolist()]
    if isinstance(ids, Sequence) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        return list(ids)
    raise TrainingError(f"sample ids must be an integer tensor or a list of ints; got {ids!r:.80}")


class LoaderStream:
    """A :class:`~resumequal.workloads.base.StatefulDataset` over a ``StatefulDataLoader``.

    Each ``next_microbatch`` is one batch of the loader; at the end of an epoch the next
    one starts (the sampler's ``set_epoch`` is called with it, where it has one).
    ``synthetic`` makes the reducer prime's microbatch; by default the first samples of a
    map-style dataset, loaded in this process with the RNGs set back afterwards.
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        *,
        ids_key: str = IDS_KEY,
        synthetic: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(loader, _stateful_dataloader_class()):
            raise TrainingError(
                f"a {type(loader).__name__} has no state_dict to checkpoint; use "
                "torchdata.stateful_dataloader.StatefulDataLoader"
            )
        self.loader = loader
        self.ids_key = ids_key
        self._synthetic = synthetic
        self._epoch = 0
        self._iterator: Iterator[Any] | None = None

    # -- the StatefulDataset protocol --------------------------------------------------

    def next_microbatch(self) -> Microbatch:
        """The loader's next batch; a finished epoch starts the next one."""
        for _ in range(2):
            if self._iterator is None:
                self._set_epoch()
                with rng_kept():
                    self._iterator = iter(self.loader)
            try:
                batch = next(self._iterator)
            except StopIteration:
                self._epoch += 1
                self._iterator = None
                continue
            return split_batch(batch, self.ids_key)
        raise TrainingError(f"the StatefulDataLoader yielded no batch in epoch {self._epoch}")

    def synthetic_microbatch(self) -> Microbatch:
        """A well-formed microbatch from no cursor; its ``sample_ids`` are empty."""
        with rng_kept():
            batch = self._synthetic() if self._synthetic is not None else self._first_samples()
        mb = split_batch(batch, self.ids_key)
        return Microbatch(sample_ids=[], data=mb.data)

    def state_dict(self) -> dict[str, Any]:
        """This stream's cursor: the epoch (the loader's own state is separate)."""
        return {EPOCH_KEY: self._epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the epoch strictly; the loader starts it over unless its state is loaded."""
        if set(state) != {EPOCH_KEY}:
            raise KeyError(f"loader cursor has keys {sorted(state)}; expected ['{EPOCH_KEY}']")
        epoch = state[EPOCH_KEY]
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"loader cursor key {EPOCH_KEY!r} must be an int >= 0, got {epoch!r}")
        self._epoch = epoch
        self._iterator = None

    # -- the loader's own state ----------------------------------------------------------

    def loader_state_dict(self) -> dict[str, Any]:
        """The loader's ``state_dict()`` as JSON values."""
        if self._iterator is None:
            self._set_epoch()  # the state may make the iterator, which reads the sampler
        with rng_kept():
            raw = self.loader.state_dict()  # type: ignore[attr-defined]
        try:
            encoded: dict[str, Any] = encode(raw, "loader state")
        except TypeError as e:
            raise TrainingError(f"the StatefulDataLoader's state cannot be checkpointed: {e}") \
                from e
        return encoded

    def load_loader_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`loader_state_dict` gave; the next batch continues from it."""
        raw = decode(state, "loader state")
        self.loader.load_state_dict(raw)  # type: ignore[attr-defined]
        self._iterator = None

    # -- helpers ---------------------------------------------------------------------------

    def _set_epoch(self) -> None:
        for sampler in (self.loader.sampler, getattr(self.loader.batch_sampler, "sampler", None)):
            set_epoch = getattr(sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self._epoch)

    def _first_samples(self) -> Any:
        dataset = self.loader.dataset
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TrainingError(
                "the reducer prime needs a synthetic microbatch: give LoaderStream a "
                "synthetic= function for an iterable dataset, or set ddp.reducerPrime: false"
            )
        size = min(self.loader.batch_size or 1, len(dataset))
        collate = self.loader.collate_fn
        return collate([dataset[i] for i in range(size)])


def check_settings(stream: LoaderStream, spec: LoaderSpec) -> None:
    """Refuse a factory's loader that was not built with the spec's ``workload.loader``."""
    loader = stream.loader
    workers = spec.workers
    expected = {
        "workers": (loader.num_workers, workers),
        "prefetchFactor": (loader.prefetch_factor, spec.prefetch_factor if workers else None),
        "persistentWorkers": (loader.persistent_workers,
                              spec.persistent_workers and workers > 0),
    }
    wrong = [f"workload.loader.{name}={want!r} but the loader has {have!r}"
             for name, (have, want) in expected.items() if have != want]
    if wrong:
        raise TrainingError(
            "the factory's StatefulDataLoader does not follow the spec (build it with "
            "ctx.loader; see resumequal.workloads.loader.loader_options): " + "; ".join(wrong)
        )


def loader_options(spec: LoaderSpec) -> dict[str, Any]:
    """``StatefulDataLoader`` keyword arguments for ``workload.loader``."""
    workers = spec.workers
    return {
        "num_workers": workers,
        "prefetch_factor": spec.prefetch_factor if workers else None,
        "persistent_workers": spec.persistent_workers and workers > 0,
    }


Sample = tuple[torch.Tensor, ...]


class SampleDataset(Dataset[tuple[Any, ...]]):
    """A built-in's samples as a map-style dataset: item ``i`` is ``(i, *make_sample(i))``.

    It is ``Stateful``: its state is the global RNG states of the process it loads in. In
    a worker that is the worker's own RNGs, which torchdata snapshots with every batch and
    restores into the worker on a resume; a built-in's augmentation (dropout-mlp) draws
    from them. In the training process the stream sets the RNGs back around the load.
    """

    def __init__(self, num_samples: int, make_sample: Callable[[int], Sample]) -> None:
        self.num_samples = num_samples
        self.make_sample = make_sample

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return (index, *self.make_sample(index))

    def state_dict(self) -> dict[str, Any]:
        version, state, gauss = random.getstate()
        name, key, pos, has_gauss, cached = cast(
            "tuple[str, np.ndarray[Any, Any], int, int, float]", np.random.get_state())
        return {
            "python": [version, list(state), gauss],
            "numpy": [name, key.tolist(), int(pos), int(has_gauss), float(cached)],
            "torch": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, py_state, gauss = state["python"]
        random.setstate((version, tuple(py_state), gauss))
        name, key, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])


def builtin_loader(spec: LoaderSpec, ctx: WorkloadContext, num_samples: int,
                   make_sample: Callable[[int], Sample],
                   blank_sample: Callable[[], Sample]) -> LoaderStream:
    """A built-in's samples through a ``StatefulDataLoader`` on ``ctx``'s rank: a
    ``DistributedSampler`` (shuffled per epoch from the training seed, the same length on
    every rank) and whole microbatches only."""
    from torch.utils.data import DistributedSampler
    from torch.utils.data.dataloader import default_collate

    microbatch_size, world_size = ctx.training.microbatch_size, ctx.world_size
    if num_samples < world_size * microbatch_size:
        raise TrainingError(
            f"num_samples={num_samples} leaves a rank without a whole microbatch of "
            f"{microbatch_size} in a world of {world_size}"
        )
    dataset = SampleDataset(num_samples, make_sample)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=ctx.rank, shuffle=True, seed=ctx.training.seed,
        drop_last=True)
    loader = _stateful_dataloader_class()(
        dataset, batch_size=microbatch_size, sampler=sampler, drop_last=True,  # type: ignore[call-arg]
        **loader_options(spec),
    )

    def synthetic() -> Any:
        blank = blank_sample()
        return default_collate([(-1, *blank)] * microbatch_size)

    return LoaderStream(loader, synthetic=synthetic)
