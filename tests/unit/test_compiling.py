"""Where inductor's cache goes under each compile.cache policy, and what the inventory keeps
of it. Nothing here compiles (the integration tests do)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch._dynamo import utils as dynamo_utils
from torch._inductor import select_algorithm

from resumequal.errors import TrainingError
from resumequal.spec import CompileSpec
from resumequal.trace.inventory import collect_inventory
from resumequal.train.compiling import CACHE_FOLDER, CompileWatch, place_cache


@pytest.fixture(autouse=True)
def _restore_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # place_cache sets these in os.environ; monkeypatch puts them back after each test.
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)


def test_a_shared_cache_is_one_folder_for_every_rank_and_warm_once_filled(
        tmp_path: Path) -> None:
    spec = CompileSpec(enabled=True)
    first = place_cache(spec, tmp_path, rank=0)
    assert first.cache_dir == str((tmp_path / CACHE_FOLDER / "shared").resolve())
    assert not first.warm
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == first.cache_dir
    assert os.environ["TRITON_CACHE_DIR"] == str(Path(first.cache_dir) / "triton")
    (Path(first.cache_dir) / "fxgraph").mkdir()
    other = place_cache(spec, tmp_path, rank=1)
    assert (other.cache_dir, other.warm) == (first.cache_dir, True)


@pytest.mark.parametrize("where", [CACHE_FOLDER, f"{CACHE_FOLDER}/shared"])
def test_a_cache_folder_others_can_write_to_is_refused(tmp_path: Path, where: str) -> None:
    # Inductor runs the code it finds in its cache: whoever can write there could plant it.
    (tmp_path / where).mkdir(parents=True)
    (tmp_path / where).chmod(0o777)
    with pytest.raises(TrainingError, match=r"compile cache folder .* mode 777"):
        place_cache(CompileSpec(enabled=True), tmp_path, rank=0)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_a_cache_folder_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "scratch" / CACHE_FOLDER).mkdir(parents=True, mode=0o700)
    (tmp_path / "scratch" / CACHE_FOLDER / "shared").symlink_to(elsewhere)
    with pytest.raises(TrainingError, match="not a folder"):
        place_cache(CompileSpec(enabled=True), tmp_path / "scratch", rank=0)


def test_a_new_cache_folder_is_private(tmp_path: Path) -> None:
    place_cache(CompileSpec(enabled=True), tmp_path, rank=0)
    for folder in (tmp_path / CACHE_FOLDER, tmp_path / CACHE_FOLDER / "shared"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_per_rank_cache_is_one_folder_per_rank(tmp_path: Path) -> None:
    spec = CompileSpec(enabled=True, cache="per-rank")
    dirs = {r: place_cache(spec, tmp_path, rank=r).cache_dir for r in (0, 1)}
    assert dirs == {r: str((tmp_path / CACHE_FOLDER / f"rank-{r}").resolve()) for r in (0, 1)}
    assert place_cache(spec, tmp_path, rank=0).cache_dir == dirs[0]


def test_a_fresh_cache_is_new_and_empty_every_time(tmp_path: Path) -> None:
    spec = CompileSpec(enabled=True, cache="fresh")
    first = place_cache(spec, tmp_path, rank=0)
    (Path(first.cache_dir) / "fxgraph").mkdir()
    second = place_cache(spec, tmp_path, rank=0)
    assert second.cache_dir != first.cache_dir and not second.warm
    assert Path(second.cache_dir).parent == (tmp_path / CACHE_FOLDER).resolve()


def test_legs_must_agree_on_compile_settings_but_not_on_the_cache_folder(
        tmp_path: Path) -> None:
    spec = CompileSpec(enabled=True, cache="fresh")
    a = collect_inventory(0, 0, place_cache(spec, tmp_path, rank=0))
    b = collect_inventory(0, 1, place_cache(spec, tmp_path, rank=0))
    assert a.compile is not None and b.compile is not None
    assert a.compile.cache_dir != b.compile.cache_dir
    assert a.comparable() == b.comparable()
    assert a.comparable()["compile"] == {"mode": "default", "cache": "fresh"}
    eager = collect_inventory(0, 0)
    assert eager.compile is None and eager.comparable() != a.comparable()
    other_mode = a.model_copy(update={"compile": a.compile.model_copy(
        update={"mode": "max-autotune"})})
    assert other_mode.comparable() != a.comparable()


class _Metrics:
    """Stands in for dynamo's per-frame compilation metrics (torch._dynamo.utils)."""

    def __init__(self, entries: list[SimpleNamespace]) -> None:
        self.entries = entries

    def get(self) -> list[SimpleNamespace]:
        return list(self.entries)

    def clear(self) -> None:
        self.entries.clear()


class _Choice:
    def __init__(self, name: str) -> None:
        self.name = name


class _Node:
    def __init__(self, *size: int) -> None:
        self.size = list(size)

    def get_size(self) -> list[int]:
        return self.size


def test_the_compile_watch_sums_what_compiled_since_the_last_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = _Metrics([])
    monkeypatch.setattr(dynamo_utils, "get_compilation_metrics", metrics.get)
    monkeypatch.setattr(dynamo_utils, "clear_compilation_metrics", metrics.clear)
    savers: list[Any] = []
    monkeypatch.setattr(select_algorithm, "add_feedback_saver", savers.append)
    watch = CompileWatch(rank=1, attempt=2)
    assert savers == [watch._saw_benchmark] and watch.after_step(1) is None

    # A cold forward frame, its lazily compiled backward, and one autotuned matmul.
    metrics.entries += [
        SimpleNamespace(entire_frame_compile_time_s=10.5, inductor_fx_local_cache_miss_count=1,
                        aotautograd_local_cache_miss_count=1),
        SimpleNamespace(backward_cumulative_compile_time_us=2_250_000,
                        inductor_fx_local_cache_miss_count=1),
    ]
    slow, fast = _Choice("extern_mm"), _Choice("cpp_gemm_0")
    savers[0]({slow: 2.0, fast: 1.0}, "mm", [_Node(32, 64), _Node(64, 256)], [slow, fast], 0)
    savers[0]({}, "mm", [], [], 0)  # nothing benchmarked: nothing chosen
    record = watch.after_step(3)
    assert record is not None
    assert record.model_dump() == {
        "kind": "compiled", "rank": 1, "attempt": 2, "step": 3, "graphs": 2, "seconds": 12.75,
        "fx_cache_hits": 0, "fx_cache_misses": 2, "autograd_cache_hits": 0,
        "autograd_cache_misses": 1,
        "autotuned": [{"op": "mm", "inputs": ["[32, 64]", "[64, 256]"],
                       "choice": "cpp_gemm_0"}]}
    assert watch.after_step(4) is None  # read once, then cleared

    # A warm recompile (a new shape, say): cache hits, nothing autotuned.
    metrics.entries.append(SimpleNamespace(entire_frame_compile_time_s=1.25,
                                           inductor_fx_local_cache_hit_count=2,
                                           aotautograd_local_cache_hit_count=1))
    later = watch.after_step(9)
    assert later is not None
    assert (later.step, later.graphs, later.seconds, later.fx_cache_hits,
            later.autograd_cache_hits, later.autotuned) == (9, 1, 1.25, 2, 1, [])
