"""`stoker phases [--json] FILE` through stoker.phases.cli.main."""

import gzip
import io
import json
import sys
from pathlib import Path

import pytest

from stoker.phases.cli import main

DATA = Path(__file__).parent / "data" / "phases"


def test_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", str(DATA / "vllm-0.22.1-h100" / "seeded-serving.log")]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"phases", "totalSeconds", "compileCache", "engineVersion"}
    assert document["engineVersion"] == "0.22.1"
    assert list(document["phases"]) == [
        "bootstrap",
        "modelInfo",
        "engineStart",
        "weightLoad",
        "dynamo",
        "compileLoad",
        "profiling",
        "graphCapture",
        "apiReady",
    ]
    assert document["totalSeconds"] == pytest.approx(66.149)
    assert document["compileCache"] == "hit"


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(DATA / "enforce-eager-kubelet.log")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["phase", "seconds"]
    assert [line.split()[0] for line in lines[1:-3]] == [
        "bootstrap",
        "modelInfo",
        "engineStart",
        "weightLoad",
        "profiling",
        "apiReady",
    ]
    assert lines[-3].split() == ["total", "30.65"]
    assert lines[-2] == "vLLM version: 0.22.1"
    assert lines[-1] == "compile cache: none"


def test_failed_startup_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = (DATA / "traceback-oom.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log)))
    assert main(["--json", "-"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["failed"] is True
    assert document["reason"].startswith("RuntimeError: Engine core initialization failed.")
    assert document["totalSeconds"] is None


def test_carriage_returns_stay_inside_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each record ends in "\r\n" and a bar redraws with bare "\r": neither may split a record in two.
    log = tmp_path / "crlf.log"
    log.write_bytes(
        b"INFO 01-02 03:04:05 [utils.py:278] non-default args: {}\r\n"
        b"(EngineCore pid=3) \rLoading: 50%\rLoading: 100%\r\n"
        b"INFO 01-02 03:04:09 [api_server.py:596] Starting vLLM server on http://0.0.0.0:8000\r\n"
        b"\xff\xfe not UTF-8\n"
    )
    assert main(["--json", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["phases"] == {"bootstrap": 0.0, "apiReady": 4.0}


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent.log")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: stoker phases" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    ["", "hello\nworld\n", "2026-01-01 12:00:00 INFO nginx started\n", '{"level": "info", "msg": "ok"}\n'],
    ids=["empty", "prose", "other-program", "json-lines"],
)
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_a_file_without_vllm_startup_lines_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, as_json: bool
) -> None:
    path = tmp_path / "other.log"
    path.write_text(text)
    assert main(["--json", str(path)] if as_json else [str(path)]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path} has no vLLM startup lines" in captured.err


def test_a_recorded_gzip_log_reads_as_the_log_it_holds(capsys: pytest.CaptureFixture[str]) -> None:
    recorded = Path(__file__).parents[2] / "bench/results/home-split-v0.26.0/config-root-only/serve.log.gz"
    assert main(["--json", str(recorded)]) == 0
    assert json.loads(capsys.readouterr().out)["phases"]


def test_gzip_on_stdin_too(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = (DATA / "vllm-0.22.1-h100" / "seeded-serving.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(log))))
    assert main(["--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["totalSeconds"] == pytest.approx(66.149)


@pytest.mark.parametrize("damage", ["cut", "corrupt"])
def test_a_damaged_gzip_log_is_an_error(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    packed = gzip.compress((DATA / "vllm-0.22.1-h100" / "seeded-serving.log").read_bytes())
    broken = packed[: len(packed) // 2] if damage == "cut" else packed[:20] + b"\0" * 40 + packed[60:]
    path = tmp_path / "serve.log.gz"
    path.write_bytes(broken)
    assert main([str(path)]) == 2
    assert f"cannot read {path}" in capsys.readouterr().err
