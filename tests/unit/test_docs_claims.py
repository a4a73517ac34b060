"""What the docs and help texts claim, held to what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from resumequal.local import runkey
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV
from resumequal_operator import main as operator_main
from resumequal_operator.render import render_yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_one_leg_by_hand_gives_the_legs_and_the_comparison_the_runs_key_and_id() -> None:
    section = _section("preemption.md", "One leg by hand")
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    lines = block.group(1).splitlines()
    first_leg = next(i for i, line in enumerate(lines) if line.startswith("torchrun"))
    exported = {line.split("=")[0].removeprefix("export ") for line in lines[:first_leg]
                if line.startswith("export ")}
    assert exported == {KEY_ENV, RUN_ID_ENV}
    assert any(line.startswith("resumequal compare") for line in lines[first_leg:])


def test_no_page_says_a_local_runs_key_is_never_kept() -> None:
    for page in DOCS.rglob("*.md"):
        text = " ".join(page.read_text().split())
        assert "never kept" not in text, page


def test_the_security_page_gives_the_kept_keys_as_the_code_keeps_them() -> None:
    text = " ".join((DOCS / "security.md").read_text().split())
    assert "<digest of the run id>.json" in text
    assert f"keeps the {runkey.KEEP_KEYS} runs used last" in text
    assert f"unused for {runkey.KEEP_DAYS} days" in text


def test_render_help_and_docs_name_every_kind_it_prints() -> None:
    manifest = (ROOT / "examples/qualificationrun.yaml").read_text()
    data = yaml.safe_load(manifest)
    data["spec"]["zoom"] = "onFail"
    kinds = {o["kind"] for o in yaml.safe_load_all(render_yaml(yaml.safe_dump(data)))}
    assert "NetworkPolicy" in kinds
    help_text = " ".join(CliRunner().invoke(operator_main.main, ["render", "--help"])
                         .output.split())
    docs = " ".join(_section("cluster.md", "Reviewing what a run would create").split())
    for kind in kinds - {"Secret"}:
        assert kind in help_text, kind
        assert kind in docs, kind


def test_the_storage_page_lists_what_stays_in_the_run_dir() -> None:
    text = " ".join(_section("storage.md", "Whole runs in S3").split())
    assert "Only the legs' logs and checkpoint staging stay" not in text
    for name in ("<leg>.log", "checkpoint staging", "verdict.json", "report.json",
                 "report.html", "metrics.prom"):
        assert name in text, name


def _sample(path: Path) -> list[str]:
    text = path.read_text()
    start = text.index("```\nINFO resumequal.local.trial")
    return text[start + 4:text.index("```", start + 4)].splitlines()


def test_the_sample_run_output_is_what_a_run_prints() -> None:
    import io

    from rich.console import Console

    from resumequal.qualify.plan import qualification_plan
    from resumequal.report.terminal import ProgressDisplay
    from resumequal.spec import QualificationSpec

    readme, quickstart = _sample(ROOT / "README.md"), _sample(DOCS / "quickstart.md")
    assert readme == quickstart
    legs = tuple(p.name for p in qualification_plan(QualificationSpec()).legs)
    phase = re.compile(r"phase=(\w+)  control (\d+)/12  preempted (\d+)/12  "
                       r"controls (\d+)/(\d+) done  restarts=(\d+)")
    lines = [line for line in readme if line.startswith("phase=")]
    assert lines
    for line in lines:
        m = phase.fullmatch(line)
        assert m is not None, line
        name, control, preempted, done, total, restarts = m.groups()
        assert int(total) == len(legs) - 2 and int(restarts) <= 1
        out = io.StringIO()
        with ProgressDisplay(Console(file=out, width=80, force_terminal=False),
                             legs=legs) as progress:
            steps = {"control": int(control), "preempted": int(preempted),
                     **{leg: 12 if i < int(done) else 0 for i, leg in enumerate(legs[2:])}}
            progress.update(name, steps, 12, int(restarts))
        assert out.getvalue().splitlines()[-1] == line
        assert len(line) <= 80
