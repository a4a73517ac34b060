"""The seed matrix: each scenario of each seed as a cell, each scenario's count of exact
seeds, and how the matrix folds into the qualification's verdict.

Pure logic on the verdict's schema (:mod:`resumequal.results.verdict`): no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from resumequal.results.verdict import Matrix, MatrixCell, MatrixRow, Result, Verdict

__all__ = ["fold_matrix", "matrix_cell", "seed_matrix"]

_WORST = (Result.PASS, Result.FAIL, Result.NONDETERMINISTIC, Result.INVALID)


def fold_matrix(verdict: Verdict, matrix: Matrix) -> Verdict:
    """A qualification with a seed matrix passes only when every scenario and seed did."""
    bad = [c for c in matrix.cells if c.result != Result.PASS]
    if verdict.result != Result.PASS or not bad:
        return verdict
    worst = max(bad, key=lambda c: _WORST.index(c.result))
    where = ", ".join(f"{c.scenario}/seed {c.seed}" for c in bad[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    detail = (f"step {worst.first_divergent_step}, {worst.first_divergent_boundary}"
              if worst.first_divergent_step is not None else worst.reason)
    reason = (f"seed matrix: {len(bad)} of {len(matrix.cells)} scenario runs not exact "
              f"({where}{more}); {worst.scenario}/seed {worst.seed}: {worst.result.value}, "
              f"{detail}")
    return verdict.model_copy(update={"result": worst.result, "reason": reason})


def matrix_cell(scenario: str, seed: int, verdict: Verdict | None, why_not: str) -> MatrixCell:
    """One scenario of one seed: its verdict, or INVALID with ``why_not`` when it has none."""
    if verdict is None:
        return MatrixCell(scenario=scenario, seed=seed, result=Result.INVALID, reason=why_not)
    d = verdict.first_divergence
    return MatrixCell(scenario=scenario, seed=seed, result=verdict.result,
                      first_divergent_step=d.step if d else None,
                      first_divergent_boundary=d.boundary if d else None,
                      reason=verdict.reason)


def seed_matrix(seeds: Sequence[int], scenarios: Sequence[str],
                cells: Sequence[MatrixCell]) -> Matrix:
    """The matrix of ``cells``, with each scenario's count of exact seeds."""
    summary = [MatrixRow(scenario=sc,
                         exact=sum(c.result == Result.PASS for c in cells if c.scenario == sc),
                         total=sum(c.scenario == sc for c in cells))
               for sc in scenarios]
    return Matrix(seeds=list(seeds), scenarios=list(scenarios), cells=list(cells),
                  summary=summary)
