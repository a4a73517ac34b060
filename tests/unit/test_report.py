"""Report files, the HTML report and the terminal summary, from hand-built Reports."""

from __future__ import annotations

import io
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from resumequal.errors import ReportError
from resumequal.report import (
    REPORT_HTML,
    REPORT_JSON,
    VERDICT_JSON,
    ProgressDisplay,
    print_summary,
    read_report,
    read_verdict,
    render_html,
    write_reports,
)
from resumequal.report.sections import CONTROL_STATUS_LABELS
from resumequal.report.svg import SVG_NS, fmt, nice_ticks
from resumequal.results.verdict import SCHEMA_VERSION, AttemptCompile, Report, Result
from resumequal.spec import SCENARIOS
from resumequal.spec.boundaries import BOUNDARIES
from tests.unit.report_samples import (
    BLIND_OMISSION,
    FAILING_BOUNDARY,
    FAILING_CELL,
    FAILING_STEP,
    KILL_STEP,
    MATRIX_SEEDS,
    RESUME_STEP,
    STEPS,
    make_controls_report,
    make_matrix_report,
    make_report,
    make_resize_report,
)

# Every sample: one per verdict, negative controls (one blind), and a seed matrix.
SAMPLES: dict[str, Report] = {
    **{r.value: make_report(r) for r in Result},
    "controls-blind": make_controls_report(blind=True),
    "controls-detected": make_controls_report(blind=False),
    "matrix": make_matrix_report(),
}

SVG_BLOCK = re.compile(r"<svg\b.*?</svg>", re.DOTALL)
NS = {"svg": SVG_NS}


def _svgs(page: str) -> dict[str, ET.Element]:
    charts = {}
    for block in SVG_BLOCK.findall(page):
        root = ET.fromstring(block)  # each chart is well-formed XML on its own
        charts[root.attrib["id"]] = root
    return charts


# -- files -------------------------------------------------------------------------------


@pytest.mark.parametrize("result", list(Result))
def test_write_reports_round_trips(tmp_path: Path, result: Result) -> None:
    report = make_report(result)
    paths = write_reports(report, tmp_path / "run")
    assert set(paths) == {VERDICT_JSON, REPORT_JSON, REPORT_HTML}
    assert all(p.is_file() and p.parent == tmp_path / "run" for p in paths.values())
    assert read_report(paths[REPORT_JSON]) == report
    assert read_verdict(paths[VERDICT_JSON]) == report.verdict
    assert json.loads(paths[VERDICT_JSON].read_text())["schema_version"] == SCHEMA_VERSION
    assert json.loads(paths[REPORT_JSON].read_text())["schema_version"] == SCHEMA_VERSION
    assert paths[REPORT_HTML].read_text(encoding="utf-8") == render_html(report)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(paths)  # no temps


@pytest.mark.parametrize("name", ["controls-blind", "matrix"])
def test_write_reports_round_trips_controls_and_matrix(tmp_path: Path, name: str) -> None:
    report = SAMPLES[name]
    paths = write_reports(report, tmp_path)
    back = read_report(paths[REPORT_JSON])
    assert back == report
    assert read_verdict(paths[VERDICT_JSON]).controls == report.verdict.controls
    assert back.verdict.controls_detected == report.verdict.controls_detected
    assert back.verdict.controls_total == report.verdict.controls_total
    assert "controls_detected" not in json.loads(paths[VERDICT_JSON].read_text())


def test_non_finite_losses_survive_the_round_trip(tmp_path: Path) -> None:
    report = make_report(Result.FAIL)
    report.legs[1].losses[-1] = math.nan
    report.verdict.loss_deltas[-1].abs_diff = math.inf
    paths = write_reports(report, tmp_path)
    back = read_report(paths[REPORT_JSON])
    assert math.isnan(back.legs[1].losses[-1])
    assert back.verdict.loss_deltas[-1].abs_diff == math.inf


def test_read_report_names_the_file_on_unknown_version(tmp_path: Path) -> None:
    path = write_reports(make_report(Result.PASS), tmp_path)[REPORT_JSON]
    data = json.loads(path.read_text())
    data["schema_version"] = "resumequal.dev/report/v99"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=r"report\.json: unknown schema_version .*v99"):
        read_report(path)


def test_read_report_names_the_file_and_field_on_invalid_content(tmp_path: Path) -> None:
    path = write_reports(make_report(Result.PASS), tmp_path)[REPORT_JSON]
    data = json.loads(path.read_text())
    data["verdict"]["result"] = "MAYBE"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=r"report\.json: not a valid Report: verdict\.result"):
        read_report(path)
    path.write_text("{not json")
    with pytest.raises(ReportError, match=r"report\.json: not JSON"):
        read_report(path)
    with pytest.raises(ReportError, match=r"missing\.json: cannot read"):
        read_report(tmp_path / "missing.json")


# -- html --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SAMPLES))
def test_html_is_self_contained(name: str) -> None:
    page = render_html(SAMPLES[name])
    # The only URL anywhere is the SVG namespace name, which is never fetched.
    urls = re.findall(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>)]*", page)
    assert set(urls) <= {SVG_NS}
    assert not re.search(r"\b(src|href)\s*=\s*[\"'](?!#)", page)  # only in-page anchors
    assert "<script" not in page.lower()
    assert "@import" not in page and "url(" not in page


@pytest.mark.parametrize("result", list(Result))
def test_html_shows_the_verdict_header(result: Result) -> None:
    report = make_report(result)
    page = render_html(report)
    assert f'<span class="badge">{result.value}</span>' in page
    color = {"PASS": "#1a7f37", "FAIL": "#cf222e", "NONDETERMINISTIC": "#d97706"}
    assert f"--vc:{color.get(result.value, '#6e7781')}" in page
    # Text from the report is escaped, never interpreted.
    assert "nightly-&lt;2026-05-09&gt;" in page and "nightly-<2026" not in page
    assert "torch2.4 &amp; cuda12.4" in page
    assert "step 7, microbatch 1, rank 1 (hard kill at microbatch)" in page


def test_html_charts_are_svg_with_titles_and_both_loss_curves() -> None:
    charts = _svgs(render_html(make_report(Result.FAIL)))
    assert set(charts) == {"loss-chart", "delta-chart"}
    for chart in charts.values():
        assert chart.attrib["role"] == "img"
        title = chart.find("svg:title", NS)
        assert title is not None and title.text
    paths = charts["loss-chart"].findall(".//svg:path", NS)
    assert sorted(p.attrib["class"] for p in paths) == [
        "series series-control",
        "series series-preempted",
    ]
    assert all(p.attrib["d"].count("L") == STEPS - 1 for p in paths)
    labels = [t.text or "" for t in charts["loss-chart"].iter(f"{{{SVG_NS}}}text")]
    assert "control" in labels and "preempted" in labels  # legend
    assert "optimizer step" in labels  # x axis label
    assert any(lbl.startswith("kill (step 7") for lbl in labels)
    assert any(lbl.startswith(f"resumed from step-{RESUME_STEP:08d}") for lbl in labels)
    deltas = charts["delta-chart"].findall(".//svg:circle[@class='delta']", NS)
    assert len(deltas) == STEPS


def test_html_delta_chart_handles_all_zero_and_non_finite_deltas() -> None:
    report = make_report(Result.PASS, zero_deltas=True)
    assert all(d.abs_diff == 0 for d in report.verdict.loss_deltas)
    chart = _svgs(render_html(report))["delta-chart"]
    texts = [t.text or "" for t in chart.iter(f"{{{SVG_NS}}}text")]
    assert "every compared step: |Δ| is exactly 0" in texts
    assert len(chart.findall(".//svg:circle[@class='delta']", NS)) == STEPS

    report.verdict.loss_deltas[3].abs_diff = math.nan
    report.verdict.loss_deltas[4].abs_diff = 5e-324  # subnormal: log10 still works
    report.legs[1].losses[2] = math.inf
    charts = _svgs(render_html(report))
    assert "NaN / ∞" in [t.text for t in charts["delta-chart"].iter(f"{{{SVG_NS}}}text")]
    d = charts["loss-chart"].find(".//svg:path[@class='series series-preempted']", NS)
    assert d is not None and d.attrib["d"].count("M") == 2  # a gap at the infinite loss


def test_html_renders_without_legs_deltas_or_table() -> None:
    report = make_report(Result.INVALID)
    report.legs = []
    report.verdict.loss_deltas = []
    report.phases = []
    page = render_html(report)
    charts = _svgs(page)
    assert set(charts) == {"loss-chart", "delta-chart"}
    assert "no per-step losses recorded" in page
    assert "No boundary table" in page


def test_html_lists_compile_time_per_leg_attempt_only_where_the_model_compiled() -> None:
    report = make_report(Result.PASS)
    assert "torch.compile" not in render_html(report)
    report.legs[0].compiled = [AttemptCompile(attempt=0, seconds=29.66, fx_cache_hits=0,
                                              fx_cache_misses=6, autotuned=0)]
    report.legs[1].compiled = [AttemptCompile(attempt=a, seconds=4.5, fx_cache_hits=6,
                                              fx_cache_misses=0, autotuned=0) for a in (0, 1)]
    page = render_html(report)
    match = re.search(r"<h3>torch.compile</h3>(<table>.*?</table>)", page, re.DOTALL)
    assert match is not None
    rows = [[c.text for c in tr] for tr in ET.fromstring(match.group(1)).findall("./tbody/tr")]
    assert [r[:2] for r in rows] == [["control", "0"], ["preempted", "0"], ["preempted", "1"]]
    assert [r[3:] for r in rows] == [["0", "6", "0"], ["6", "0", "0"], ["6", "0", "0"]]
    assert Report.model_validate_json(report.model_dump_json()) == report


def _boundary_table(page: str) -> ET.Element:
    match = re.search(r'<table class="boundaries">.*?</table>', page, re.DOTALL)
    assert match is not None
    return ET.fromstring(match.group(0))


def test_html_boundary_table_highlights_the_first_divergence() -> None:
    page = render_html(make_report(Result.FAIL))
    table = _boundary_table(page)
    header = [th.text for th in table.iter("th")]
    assert header == ["step", "attempt", *BOUNDARIES]
    rows = table.findall("./tbody/tr")
    assert len(rows) == STEPS
    assert all(len(r.findall("td")) == 2 + len(BOUNDARIES) for r in rows)
    first = [td for td in table.iter("td") if "first" in td.attrib.get("class", "").split()]
    assert len(first) == 1
    assert first[0].attrib["id"] == "first-divergence"
    assert first[0].attrib["title"] == f"step {KILL_STEP}, rng: differs"
    assert 'href="#first-divergence"' in page
    assert page.count('id="first-divergence"') == 1
    statuses = {c for td in table.iter("td") for c in td.attrib.get("class", "").split()}
    assert {"s-equal", "s-differs"} <= statuses


def test_html_pass_has_no_highlight_but_every_status_colour() -> None:
    page = render_html(make_report(Result.PASS))
    table = _boundary_table(page)
    assert not [td for td in table.iter("td") if "first" in td.attrib.get("class", "")]
    assert 'id="first-divergence"' not in page
    assert 'class="cell s-within_tolerance"' in page


def test_html_lists_checks_phases_drift_and_inventory() -> None:
    report = make_report(Result.INVALID)
    page = render_html(report)
    assert "✗ <strong>restarted</strong>" in page
    assert "✓ <strong>kill_delivered</strong>" in page
    for phase in ("Pending", "Killing", "Succeeded"):
        assert f"<th>{phase}</th>" in page
    assert "inventories differ" in page and "2.5.0" in page
    assert "CUBLAS_WORKSPACE_CONFIG" in page

    page = render_html(make_report(Result.FAIL))
    assert "Worst tensors: model" in page and "blocks.0.attn.weight" in page
    assert "0.00025" in page  # model max abs diff


def test_html_anchor_falls_back_to_the_divergence_box_without_a_table_cell() -> None:
    report = make_report(Result.FAIL)
    report.verdict.boundary_table = []
    page = render_html(report)
    assert page.count('id="first-divergence"') == 1
    assert '<div class="diverge" id="first-divergence">' in page


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.13, 0.47, [0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45]),
        (2.0, 2.0, [2.0]),
    ],
)
def test_nice_ticks(lo: float, hi: float, expected: list[float]) -> None:
    assert nice_ticks(lo, hi, 6) == expected


def test_nice_ticks_integer_steps() -> None:
    assert nice_ticks(1, 12, 10, integer=True) == list(range(1, 13))
    assert nice_ticks(1, 1000, 10, integer=True)[:3] == [100, 200, 300]
    assert fmt(0.30000000000000004) == "0.3" and fmt(1e-7) == "1e-07" and fmt(3.0) == "3"


# -- html: negative controls and the seed matrix -----------------------------------------


@dataclass
class _Cell:
    text: str = ""
    attrs: dict[str, str] = field(default_factory=dict)


class _Tables(HTMLParser):
    """The rows of every table (header rows included) as cells with their text and attrs."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[_Cell]]] = {}
        self._table: list[list[_Cell]] | None = None
        self._cell: _Cell | None = None
        self.spans: list[_Cell] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self._table = self.tables.setdefault(a.get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = _Cell(attrs=a)
            self._table[-1].append(self._cell)
        elif tag == "span" and self._cell is not None:
            self.spans.append(_Cell(attrs=a))

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.text += data


def _tables(page: str) -> _Tables:
    parser = _Tables()
    parser.feed(page)
    return parser


def _section(page: str, anchor: str) -> str:
    match = re.search(rf'<section id="{anchor}">.*?</section>', page, re.DOTALL)
    assert match is not None, anchor
    return match.group(0)


def test_html_controls_section_names_a_blind_control() -> None:
    report = SAMPLES["controls-blind"]
    page = render_html(report)
    section = _section(page, "controls")
    assert "3 of 4 applicable controls detected (1 not applicable)" in section
    assert '<div class="blind"><strong>comparator blind to data_cursor</strong>' in section
    assert "the verdict is INVALID" in section
    # The header says it too, next to the link to the section.
    header = page[: page.index("</header>")]
    assert 'href="#controls"' in header and f"comparator blind to {BLIND_OMISSION}" in header

    parsed = _tables(section)
    head, *rows = parsed.tables["controls"]
    assert [c.text for c in head] == [
        "omission",
        "method",
        "status",
        "first divergence",
        "max param diff",
        "mechanism",
        "evidence",
    ]
    assert [r[0].text for r in rows] == [
        "rngleg control-rng",
        "schedulerleg control-scheduler",
        "model_optimizer_onlyleg control-model-optimizer-only",
        "data_cursorleg control-data-cursor",
        "pending_grads",  # not run: no leg
    ]
    assert [r[2].text for r in rows] == [
        "detected",
        "detected",
        "detected",
        "blind",
        "not applicable",
    ]
    badges = [s.attrs["class"] for s in parsed.spans if "cs" in s.attrs["class"].split()]
    assert badges == ["cs cs-detected"] * 3 + ["cs cs-blind", "cs cs-not_applicable"]
    rng, _, _, cursor, pending = rows
    assert rng[3].text == "step 7 · rng · rank 0" and rng[4].text == "0.0031"
    assert cursor[3].text == "—" and cursor[4].text == "0"
    assert pending[4].text == "—"
    assert pending[6].text == "cut microstep 0: the window's first backward had not run"
    # Report text is escaped.
    assert "&lt;inputs&gt; were not compared" in section and "<inputs>" not in section


def test_html_badge_colours_are_defined_for_every_status() -> None:
    page = render_html(SAMPLES["controls-detected"])
    colours = {
        "detected": "#1a7f37",  # green
        "blind": "#cf222e",  # red
        "not_applicable": "#6e7781",  # grey
        "invalid": "#d97706",  # orange
        "not_judged": "#6e7781",  # grey
    }
    assert set(colours) == set(CONTROL_STATUS_LABELS)
    for status, colour in colours.items():
        assert f".cs-{status} {{ background: {colour}; }}" in page


def test_html_controls_all_detected_has_no_blind_note_and_shows_invalid() -> None:
    report = make_controls_report(blind=False)
    section = _section(render_html(report), "controls")
    assert "4 of 4 applicable controls detected (1 not applicable)" in section
    assert "comparator blind" not in section and 'class="blind"' not in section

    report.verdict.controls[0].status = "invalid"
    report.verdict.controls[0].mechanism = "the control leg was never killed"
    section = _section(render_html(report), "controls")
    assert "3 of 4 applicable controls detected" in section
    assert '<span class="cs cs-invalid" title="expected: diverge">invalid</span>' in section
    assert "comparator blind" not in section


def test_html_without_controls_says_none_were_run() -> None:
    page = render_html(make_report(Result.PASS))
    assert "No negative controls were run" in _section(page, "controls")
    header = page[: page.index("</header>")]
    assert "negative controls" not in header


def test_html_seed_matrix_marks_the_failing_cell() -> None:
    report = SAMPLES["matrix"]
    page = render_html(report)
    section = _section(page, "matrix")
    head, *rows = _tables(section).tables["matrix"]
    assert [c.text for c in head] == [
        "scenario",
        *(f"seed {s}" for s in MATRIX_SEEDS),
        "exact/total",
    ]
    assert [r[0].text for r in rows] == list(SCENARIOS)
    assert all(len(r) == 2 + len(MATRIX_SEEDS) for r in rows)
    scenario, seed = FAILING_CELL
    for row in rows:
        for s, cell in zip(MATRIX_SEEDS, row[1:-1], strict=True):
            if (row[0].text, s) == FAILING_CELL:
                assert cell.text == f"step {FAILING_STEP} · {FAILING_BOUNDARY}"
                assert cell.attrs["class"] == "m m-fail"
                assert cell.attrs["title"] == (
                    f"{scenario}, seed {seed}: FAIL — reduced gradients differ: bucket "
                    "layout <rebuilt> after resume"
                )
            else:
                assert (cell.text, cell.attrs["class"]) == ("exact", "m m-exact")
        expected = "4/5" if row[0].text == scenario else "5/5"
        assert row[-1].text == expected
        assert row[-1].attrs["class"] == ("num bad" if expected == "4/5" else "num ok")
    assert "bucket layout &lt;rebuilt&gt;" in section  # the tooltip is escaped
    header = page[: page.index("</header>")]
    assert 'href="#matrix"' in header and "19/20 exact" in header
    assert "(4 scenarios x 5 seeds)" in header


def test_html_seed_matrix_invalid_tolerance_and_missing_cells() -> None:
    report = make_matrix_report()
    assert report.matrix is not None
    cells = report.matrix.cells
    cells[0] = cells[0].model_copy(
        update={"result": Result.INVALID, "reason": "the kill did not land"}
    )
    cells[1] = cells[1].model_copy(
        update={"first_divergent_step": 8, "first_divergent_boundary": "params"}
    )
    cells[2] = cells[2].model_copy(
        update={"result": Result.NONDETERMINISTIC, "first_divergent_step": 2}
    )
    del cells[3]  # (boundary-hard, seed 3) did not run
    row = _tables(_section(render_html(report), "matrix")).tables["matrix"][1]
    assert [(c.text, c.attrs["class"]) for c in row[1:-1]] == [
        ("INVALID", "m m-invalid"),
        ("≈ step 8 · params", "m m-tolerance"),
        ("step 2", "m m-nondeterministic"),
        ("—", "m m-none"),
        ("exact", "m m-exact"),
    ]
    assert row[1].attrs["title"] == "boundary-hard, seed 0: INVALID — the kill did not land"
    assert row[4].attrs["title"] == "boundary-hard, seed 3: not run"


def test_html_has_no_matrix_section_without_a_matrix() -> None:
    page = render_html(make_report(Result.FAIL))
    assert 'id="matrix"' not in page and "Seed matrix" not in page


def test_html_boundary_table_shows_not_compared_boundaries() -> None:
    page = render_html(SAMPLES["controls-blind"])
    table = _boundary_table(page)
    inputs = [row.findall("td")[2] for row in table.findall("./tbody/tr")]
    assert all(td.attrib["class"] == "cell s-not_compared" for td in inputs)
    assert inputs[0].attrib["title"] == "step 1, inputs: not compared"
    assert "Not compared (the spec&#x27;s comparison.boundaries" in page
    assert '<b class="s-not_compared"> </b> not compared' in page  # in the legend
    assert "Not compared" not in render_html(make_report(Result.PASS))


# -- terminal ----------------------------------------------------------------------------


def _summary(report: Report, *, styles: bool = False, width: int = 110) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system="standard")
    print_summary(report, console)
    return console.export_text(styles=styles)


def test_summary_counts_controls_and_names_the_blind_ones_in_red() -> None:
    report = SAMPLES["controls-blind"]
    text = _summary(report)
    line = next(ln for ln in text.splitlines() if "controls detected" in ln)
    assert "3 of 4 applicable controls detected (1 not applicable)  blind: data_cursor" in line
    styled = _summary(report, styles=True)
    # The blind omission is printed bold red (SGR 1;31).
    assert re.search(r"\x1b\[1;31m\s*blind: data_cursor", styled)
    assert "not compared" in text and "inputs" in text

    text = _summary(SAMPLES["controls-detected"])
    assert "4 of 4 applicable controls detected (1 not applicable)" in text
    assert "blind" not in text
    assert "controls detected" not in _summary(make_report(Result.PASS))


def test_summary_names_invalid_controls() -> None:
    report = make_controls_report(blind=False)
    report.verdict.controls[1].status = "invalid"
    text = _summary(report)
    assert "3 of 4 applicable controls detected (1 not applicable)  invalid: scheduler" in text


def test_controls_not_judged_are_neither_owed_nor_not_applicable() -> None:
    report = make_controls_report(blind=False)
    report.verdict.result = Result.NONDETERMINISTIC
    for c in report.verdict.controls:
        if c.status != "not_applicable":
            c.status = "not_judged"
    text = _summary(report, width=160)
    sentence = ("0 of 0 applicable controls detected (1 not applicable) (4 not judged: the "
                "legs differ before the kill)")
    assert sentence in text
    html = render_html(report)
    assert sentence in html
    assert html.count(">not judged<") == 4


def test_the_terminal_and_the_html_give_the_same_count_of_controls() -> None:
    report = make_controls_report(blind=True)
    statuses = ["detected", "invalid", "not_applicable", "not_judged", "blind"]
    for control, status in zip(report.verdict.controls, statuses, strict=True):
        control.status = status  # type: ignore[assignment]
    counts = report.verdict.control_counts
    assert (counts.detected, counts.applicable, counts.not_applicable, counts.not_judged) == (
        1, 3, 1, 1)
    sentence = counts.words()
    assert sentence.startswith("1 of 3 applicable controls detected (1 not applicable)")
    text = _summary(report, width=200)
    html = render_html(report)
    assert sentence in text
    assert html.count(escape(sentence)) == 2  # the header's fact and the controls section
    # Nothing else counts them: the metrics' figures are the same numbers.
    assert (report.verdict.controls_detected, report.verdict.controls_total) == (1, 3)


def test_summary_prints_a_compact_seed_matrix() -> None:
    report = make_matrix_report()
    assert report.matrix is not None
    report.matrix.cells[0] = report.matrix.cells[0].model_copy(
        update={"result": Result.INVALID, "reason": "no kill"}
    )
    lines = _summary(report).splitlines()
    start = next(i for i, ln in enumerate(lines) if "seed matrix" in ln)
    head = lines[start + 1]
    assert "scenario" in head and "exact/total" in head
    assert all(f"seed {s}" in head for s in MATRIX_SEEDS)
    rows = {ln.split()[1]: ln for ln in lines[start + 2 : start + 2 + len(SCENARIOS)]}
    assert set(rows) == set(SCENARIOS)
    assert f"{FAILING_STEP}·{FAILING_BOUNDARY}" in rows[FAILING_CELL[0]]
    assert rows[FAILING_CELL[0]].rstrip(" │").endswith("4/5")
    assert "INVALID" in rows["boundary-hard"] and rows["boundary-hard"].count("exact") == 4
    assert rows["mid-hard"].count("exact") == 5
    assert "seed matrix" not in _summary(make_report(Result.FAIL))


def test_summary_shows_verdict_divergence_checks_and_files(tmp_path: Path) -> None:
    console = Console(record=True, width=100, file=io.StringIO())
    report = make_report(Result.FAIL)
    print_summary(report, console, files={"report.html": tmp_path / "report.html"})
    text = console.export_text()
    assert "FAIL" in text and report.verdict.reason[:40] in text
    assert "step 7 · rng · rank 1 (after the resume)" in text
    assert "model drift" in text and "0.00025" in text
    assert str(tmp_path / "report.html") in text

    console = Console(record=True, width=100, file=io.StringIO())
    report = make_report(Result.INVALID)
    report.pin = "registry.local/train:[bold]nightly[/]"
    report.verdict.checks[1].detail = "no restart [/red] seen"
    print_summary(report, console)
    text = console.export_text()
    assert "INVALID" in text and "failing checks" in text and "inventories_equal" in text
    # Report text that looks like rich markup is printed as it is, not interpreted.
    assert "no restart [/red] seen" in text and "[bold]nightly[/]" in text


def test_a_step_the_resumed_attempt_ran_before_the_cuts_step_is_after_the_resume() -> None:
    # Cut at step 6, resumed from the checkpoint after step 4: step 5 ran again, resumed.
    report = make_report(Result.FAIL)
    report.verdict.cut.step = 6
    d = report.verdict.first_divergence
    assert d is not None
    d.step, d.before_cut = 5, False
    label = "step 5 · rng · rank 1 (after the resume)"
    text, html = _summary(report), render_html(report)
    assert label in text and escape(label) in html
    for shown in (text, html):
        assert "after the cut" not in shown
    d.before_cut = True  # the legs already differed before the kill
    assert "step 5 · rng · rank 1 (before the cut)" in _summary(report)


def test_leg_progress_prints_plain_lines_without_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False)
    clock = iter(float(t) for t in range(100))
    with ProgressDisplay(console, interval=5.0, clock=lambda: next(clock)) as progress:
        progress.update("Launching", {"control": 0, "preempted": 0}, 12, 0)
        progress.update("Running", {"control": 1, "preempted": 1}, 12, 0)  # phase changed
        progress.update("Running", {"control": 2, "preempted": 2}, 12, 0)  # throttled
        progress.update("Running", {"control": 3, "preempted": 2}, 12, 1)  # restart
        progress.update("Running", {"control": 12, "preempted": 5}, 12, 1)  # leg done
        progress.update("Comparing", {"control": 12, "preempted": 12}, 12, 1)
    lines = out.getvalue().splitlines()
    assert lines == [
        "phase=Launching  control 0/12  preempted 0/12  restarts=0",
        "phase=Running  control 1/12  preempted 1/12  restarts=0",
        "phase=Running  control 3/12  preempted 2/12  restarts=1",
        "phase=Running  control 12/12  preempted 5/12  restarts=1",
        "phase=Comparing  control 12/12  preempted 12/12  restarts=1",
    ]
    assert "\x1b" not in out.getvalue()


def test_the_negative_controls_are_counted_in_one_short_line_without_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False)  # as in a CI log
    legs = ("control", "preempted", "omit-rng", "omit-data-cursor", "omit-scheduler",
            "omit-optimizer", "omit-model-optimizer-only", "omit-pending-grads")
    with ProgressDisplay(console, legs=legs) as progress:
        progress.update("Resumed", {**dict.fromkeys(legs, 12), "omit-optimizer": 7,
                                    "omit-model-optimizer-only": 0,
                                    "omit-pending-grads": 0}, 12, 1)
    line = "phase=Resumed  control 12/12  preempted 12/12  controls 3/6 done  restarts=1"
    assert len(line) <= 80
    assert out.getvalue().splitlines() == [line]


def test_leg_progress_draws_live_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True)
    with ProgressDisplay(console) as progress:
        progress.update("Running", {"control": 4, "preempted": 3}, 12, 1)
    text = out.getvalue()
    assert "Running" in text and "4/12" in text and "3/12" in text


def test_counts_read_in_the_singular_for_one() -> None:
    from resumequal.words import count

    assert [count(1, "rank"), count(2, "rank"), count(0, "bucket")] == [
        "1 rank", "2 ranks", "0 buckets"]
    assert count(1, "child", "children") == "1 child"
    assert count(3, "child", "children") == "3 children"


def test_result_uris_wrap_in_a_narrow_terminal_and_are_never_cut() -> None:
    uri = ("s3://resumequal-runs/qualifications/training/nightly-2026-11-29/"
           "3f1c9a0e-5b7d-4c1e-9a55-1e2f3a4b5c6d/report.html")
    console = Console(record=True, width=70, file=io.StringIO(), color_system=None)
    print_summary(make_report(Result.PASS), console, files={"report.html": uri})
    text = console.export_text()
    assert "…" not in text
    # The URI, read back across its folded lines, whole.
    lines = [ln.strip("│ ").strip() for ln in text.splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("report.html"))
    parts = [lines[start].removeprefix("report.html").strip()]
    for ln in lines[start + 1:]:
        if not ln or not uri.startswith("".join(parts) + ln):
            break
        parts.append(ln)
    assert "".join(parts) == uri


# -- resize ------------------------------------------------------------------------------


def test_a_resize_outcome_round_trips_and_reports_without_one_still_read(
    tmp_path: Path,
) -> None:
    report = make_resize_report(ledger_step=6)
    paths = write_reports(report, tmp_path)
    assert read_report(paths[REPORT_JSON]) == report
    assert read_verdict(paths[VERDICT_JSON]).resize == report.verdict.resize
    # A report from before resizes existed has no "resize" key and reads as None.
    old = json.loads(paths[REPORT_JSON].read_text())
    del old["verdict"]["resize"]
    paths[REPORT_JSON].write_text(json.dumps(old))
    assert read_report(paths[REPORT_JSON]).verdict.resize is None


def test_html_resize_section_shows_parts_handoffs_and_world_size_per_step() -> None:
    page = render_html(make_resize_report(ledger_step=6))
    section = _section(page, "resize")
    assert "ranks 2 → 1 → 2: resized from step 4, grown from step 8." in section
    tables = _tables(section).tables
    steps = tables["resize-steps"]
    assert [c.text for c in steps[0]] == ["step", "world size", "attempt", "data ledger",
                                          "max |Δ loss|", "|Δ grad norm|", "within tolerance"]
    assert [(r[0].text, r[1].text) for r in steps[1:]][3:6] == [
        ("4", "2"), ("5resized", "1"), ("6", "1")]
    assert steps[6][3].text == "wrong" and steps[6][3].attrs["class"] == "bad"
    assert steps[5][3].text == "exact"
    handoffs = tables["handoffs"]
    assert [c.text for c in handoffs[1]] == ["1", "step-00000004", "2", "1", "equal", "equal"]
    assert [c.text for c in handoffs[2]] == ["2", "step-00000008", "1", "2", "equal", "—"]
    assert section.count('<li class="bad">') == 1 and "data ledger (exact)" in section
    assert "<details>" not in section  # short enough to stay open
    assert "Resize" not in _section(render_html(make_report(Result.PASS)), "boundaries")
    assert 'id="resize"' not in render_html(make_report(Result.PASS))


def test_html_long_resize_step_tables_fold() -> None:
    section = _section(render_html(make_resize_report(steps=40)), "resize")
    assert "<details><summary>40 steps, 0 with a wrong ledger or over a tolerance</summary>" \
        in section


def test_html_loss_chart_marks_the_resize_and_the_grow() -> None:
    charts = _svgs(render_html(make_resize_report()))
    labels = [t.text or "" for t in charts["loss-chart"].iter(f"{{{SVG_NS}}}text")]
    assert "resized to 1 rank(s) from step 4" in labels
    assert "grown to 2 ranks from step 8" in labels
    assert not any(lbl.startswith("resumed from") for lbl in labels)


def test_summary_prints_one_line_per_resize_part() -> None:
    text = _summary(make_resize_report(ledger_step=6))
    lines = [" ".join(ln.strip("│ ").split()) for ln in text.splitlines()]
    assert "resize 2 → 1 → 2 ranks" in lines
    parts = [ln for ln in lines if ln[:1] in ("✓", "✗")]
    assert [ln.split(" (")[0] for ln in parts] == [
        "✓ before the resize", "✓ handoff", "✗ data ledger", "✓ drift"]
    assert "✗ data ledger (exact) step 6: 4 sample ids missing (e.g. 601, 602, 603 …)" in parts
    assert "resize 2 → 1 → 2 ranks" not in _summary(make_report(Result.PASS))


def _with_tensors(report: Report) -> Report:
    from resumequal.results.verdict import ModuleDifference, TensorDifference

    first = report.verdict.first_divergence
    assert first is not None
    differing = [f"layers.{i}.attn.weight" for i in range(3, 0, -1)] + ["<b>.weight"]
    tensors = TensorDifference(
        total=12, differ=4, order="backward", first=differing[0], differing=differing,
        modules=[ModuleDifference(module=f"layers.{i}.attn", differ=1, total=2)
                 for i in range(3, 0, -1)]
        + [ModuleDifference(module="<b>", differ=1, total=1),
           ModuleDifference(module="head", differ=0, total=5)])
    div = first.model_copy(update={"boundary": "reduced_grads", "tensors": tensors})
    return report.model_copy(update={"verdict": report.verdict.model_copy(
        update={"first_divergence": div})})


def test_a_divergence_names_its_differing_tensors_by_module() -> None:
    report = _with_tensors(make_report(Result.FAIL))
    page = render_html(report)
    assert "4 of 12 tensors differ (first in backward order: layers.3.attn.weight)" in page
    assert "by module (4 with differences)" in page and "head" not in page.split(
        "by module")[1].split("</details>")[0]
    assert "<code>&lt;b&gt;.weight</code>" in page and "<b>.weight" not in page
    # report.json keeps every differing tensor; the terminal the busiest modules.
    again = Report.model_validate_json(report.model_dump_json())
    assert again.verdict.first_divergence == report.verdict.first_divergence
    console = Console(record=True, width=160, file=io.StringIO())
    print_summary(report, console=console)
    text = console.export_text()
    assert "4 of 12 tensors differ (first in backward order: layers.3.attn.weight); by " \
           "module: layers.3.attn 1/2, layers.2.attn 1/2, layers.1.attn 1/2" in text


def test_a_divergence_at_the_restore_shows_its_tensors_cause_and_fix() -> None:
    from resumequal.results.verdict import RestoredTensor

    report = make_report(Result.FAIL)
    d = report.verdict.first_divergence
    assert d is not None
    d.at_restore, d.step, d.boundary = True, 4, "params"
    d.restored = [RestoredTensor(name="features.1.running_mean", kind="buffer", ranks=[0],
                                 cause="per_rank", kept_rank=1)]
    d.cause = "buffer features.1.running_mean differed between the ranks when step-4 was saved"
    d.fix = "keep the buffers equal on every rank (SyncBatchNorm)"
    text = " ".join(_summary(report, width=200).split())
    assert f"step 4 · params · rank {d.rank} (at the restore)" in text
    assert f"cause {d.cause}" in text and f"fix {d.fix}" in text
    page = render_html(report)
    assert "at the restore: the state restored against the state saved" in page
    assert "<th>cause</th><td>buffer features.1.running_mean differed" in page
    assert "<td><code>features.1.running_mean</code></td><td>buffer</td><td>0</td>" \
           "<td>per_rank</td><td>1</td>" in page
