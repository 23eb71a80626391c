"""README.md's figures come from bench/results/, its demo output from a recorded demo, and its commands run.

A number with a unit in the README (seconds, minutes, GB, a ratio like 3.97x) must be found in a
bench/results/ file that the same section names: in a JSON file as a value that rounds to it, in a text
file as written. So a figure cannot outlive the run it came from, and a new run that changes it fails
here until the README says what the run says.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
PREDICTION = REPO / "docs" / "concepts" / "prediction.md"
DEMO_OUTPUT = REPO / "bench" / "results" / "demo-output.txt"
MAX_README_BYTES = 15 * 1024

RESULTS_FILE = r"bench/results/[\w.+-]+\.(?:json|txt)"
# A figure: "1 min 34 s", or a number with a unit of time, size, speed or ratio.
FIGURE = re.compile(
    r"(?<![\w.])(?:\d+ min \d+ s|(\d+(?:\.\d+)?) ?(?:min|s|GB|GiB|MB|MiB|tok/s|x|%)(?![\w/]))"
)
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]*\d)")
# Results files keep sizes in bytes.
BYTES_PER_UNIT = {"GB": 10**9, "MB": 10**6, "GiB": 2**30, "MiB": 2**20}


def sections(text: str, level: str = "##") -> Iterator[tuple[str, str]]:
    """(heading, body) of each section of `level`, fenced code blocks removed."""
    prose = re.sub(r"(?ms)^```.*?^```", "", text)
    for part in re.split(rf"(?m)^(?={level} )", prose):
        yield part.splitlines()[0] if part else "", part


def numbers_in(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from numbers_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from numbers_in(item)


def found_in_json(number: str, values: list[float], scale: int = 1) -> bool:
    """Some value of the file rounds to `number` (times `scale`) at the decimals it is written with."""
    decimals = len(number.partition(".")[2])
    tolerance = (0.5 * 10**-decimals + 1e-9) * scale
    return any(abs(value - float(number) * scale) <= tolerance for value in values)


def found(figure: str, number: str | None, results: Path) -> bool:
    """`figure` in a results file: a JSON value that rounds to it (sizes in bytes), or the text as written."""
    if results.suffix == ".json":
        values = list(numbers_in(json.loads(results.read_text(encoding="utf-8"))))
        unit = figure.removeprefix(number or "").strip()
        return number is not None and found_in_json(number, values, BYTES_PER_UNIT.get(unit, 1))
    return figure in " ".join(results.read_text(encoding="utf-8").split())


def performance_rows() -> list[list[str]]:
    section = next(body for heading, body in sections(README.read_text()) if heading == "## What to expect")
    rows = [line for line in section.splitlines() if line.startswith("| ") and "bench/results/" in line]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_readme_is_at_most_15_kb() -> None:
    assert len(README.read_bytes()) <= MAX_README_BYTES, f"README.md is {len(README.read_bytes())} bytes"


def test_one_performance_table_with_a_results_file_per_row() -> None:
    rows = performance_rows()
    assert len(rows) >= 2
    for row in rows:
        (path,) = re.findall(RESULTS_FILE, row[0])
        assert (REPO / path).is_file(), path
    assert "docs/benchmarks/gpu-coldstart.md" in README.read_text(), "the full benchmark page is linked"


@pytest.mark.parametrize("row", performance_rows(), ids=lambda row: row[0])
def test_every_number_in_the_performance_table_is_in_its_results_file(row: list[str]) -> None:
    (path,) = re.findall(RESULTS_FILE, row[0])
    values = list(numbers_in(json.loads((REPO / path).read_text(encoding="utf-8"))))
    cells = " | ".join(row[1:])
    figures = NUMBER.findall(cells)
    assert figures, row
    missing = [number for number in figures if not found_in_json(number, values)]
    assert not missing, f"{missing} are not in {path}"


def unfound_figures(heading: str, body: str, text: str) -> Iterator[str]:
    named = [REPO / path for path in re.findall(RESULTS_FILE, body)]
    for match in FIGURE.finditer(text):
        figure, number = match.group(0), match.group(1)
        if not any(path.is_file() and found(figure, number, path) for path in named):
            yield f"{heading}: {figure!r} is in none of {[path.name for path in named]}"


def test_every_figure_in_the_readme_is_in_a_results_file_its_section_names() -> None:
    problems = []
    for heading, body in sections(README.read_text()):
        # The performance table's cells are numbers without units, checked above.
        prose = "\n".join(line for line in body.splitlines() if not line.startswith("| "))
        problems.extend(unfound_figures(heading, body, prose))
    assert not problems, "\n".join(problems)


def test_the_fresh_machine_costs_in_getting_started_are_the_measured_ones() -> None:
    (heading, body), *_ = [
        (heading, body)
        for heading, body in sections(GETTING_STARTED.read_text(), "###")
        if heading == "### What they cost"
    ]
    problems = list(unfound_figures(heading, body, body))
    assert len(list(FIGURE.finditer(body))) >= 10
    assert not problems, "\n".join(problems)


def test_the_figure_check_catches_a_stale_figure() -> None:
    run = REPO / "bench" / "results" / "coldstart-h100.json"
    values = list(numbers_in(json.loads(run.read_text(encoding="utf-8"))))
    assert found_in_json("3.97", values)
    assert not found_in_json("3.96", values)
    setup = REPO / "bench" / "results" / "fresh-machine-setup.txt"
    assert found("9 min 6 s", None, setup)
    assert not found("7 min 26 s", None, setup)
    assert found("16 GB", "16", run), "the model's bytes"
    assert not found("16 MB", "16", run)


# ---------------------------------------------------------------------------------------- the demo


def printer_columns() -> list[str]:
    crd = yaml.safe_load((REPO / "crds" / "stoker.dev_vllmservices.yaml").read_text(encoding="utf-8"))
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    return ["NAME", *(column["name"].upper() for column in columns)]


def demo_blocks(path: Path) -> list[list[str]]:
    """The ```text blocks of `path` that show `kubectl get vllmservices` output."""
    blocks = re.findall(r"(?ms)^```text\n(.*?)^```", path.read_text(encoding="utf-8"))
    return [block.splitlines() for block in blocks if block.startswith("NAME ") and "READY" in block]


@pytest.mark.parametrize("path", [README, GETTING_STARTED], ids=lambda path: path.name)
def test_demo_output_shown_is_the_recorded_demo_with_todays_columns(path: Path) -> None:
    blocks = demo_blocks(path)
    assert blocks, f"{path.name} shows no demo output"
    recorded = DEMO_OUTPUT.read_text(encoding="utf-8").splitlines()
    for block in blocks:
        assert block[0].split() == printer_columns(), "the columns of the CRD's printer columns"
        missing = [line for line in block if line.strip() and line not in recorded]
        assert not missing, f"not in {DEMO_OUTPUT.name}: {missing}"


# --------------------------------------------------------------------------------- the commands


def test_readme_names_the_two_commands_as_the_makefile_and_ci_have_them() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"(?m)^demo:", makefile) and re.search(r"(?m)^test:", makefile)
    assert "make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    block = re.search(r"(?ms)^## Two commands\n+```bash\n(.*?)^```", README.read_text()).group(1)
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["make demo", "make test"]


def predict_example(path: Path) -> str:
    blocks = re.findall(r"(?ms)^```bash\n(.*?)^```", path.read_text(encoding="utf-8"))
    (block,) = [block for block in blocks if "stoker predict" in block]
    return block


@pytest.mark.parametrize("path", [README, GETTING_STARTED], ids=lambda path: path.name)
def test_documented_predict_example_runs_without_a_model_of_your_own(path: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "llama-8b"
    venv_bin = Path(sys.executable).parent
    script = predict_example(path).replace("/tmp/llama-8b", str(model_dir))
    script = script.replace(".venv/bin/", f"{venv_bin}/")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    shown = re.search(r"(?ms)^```text\n\$ \.venv/bin/stoker predict.*?\n(.*?)^```", PREDICTION.read_text())
    assert shown, "docs/concepts/prediction.md shows the example's output"
    expected = [line.replace("/tmp/llama-8b", str(model_dir)) for line in shown.group(1).splitlines()]
    expected = [line for line in expected if line.strip() != "fitted on: …"]
    actual = result.stdout.splitlines()
    assert actual[: len(expected)] == expected
    total = next(line.split()[1] for line in actual if line.startswith("total "))
    assert f"It predicts {total} s" in GETTING_STARTED.read_text(encoding="utf-8")
