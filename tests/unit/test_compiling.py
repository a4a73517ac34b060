"""Where inductor's cache goes under each compile.cache policy, and what the inventory keeps
of it. Nothing here compiles (the integration tests do)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resumequal.spec import CompileSpec
from resumequal.trace.inventory import collect_inventory
from resumequal.train.compiling import CACHE_FOLDER, place_cache


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
