"""`stoker predict` through the CLI's main(): a real model directory, services from files, clear refusals."""

import json
from pathlib import Path

import pytest
import yaml

from stoker.cli import main as stoker_main
from stoker.predict.cli import EXIT_INVALID, EXIT_UNREADABLE, main
from tests.unit.test_predict_facts import LLAMA_CONFIG, write_model
from tests.unit.test_render_fast_start import ON_A_VOLUME

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture
def model_dir(tmp_path: Path) -> str:
    write_model(tmp_path / "model", LLAMA_CONFIG)
    return str(tmp_path / "model")


def test_a_table_of_the_default_services_start(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert stoker_main(["predict", model_dir]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["phase", "seconds", "regime"]
    for phase in ("bootstrap", "weightLoad", "compileLoad", "graphCapture", "total"):
        assert f"\n{phase} " in out
    assert "coefficients: NVIDIA-H100-80GB-HBM3_x1_v0.26 (shipped)" in out
    assert "fitted on: l8-h4096" in out


def test_where_the_coefficients_came_from_is_wrapped_for_a_terminal(
    model_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped H100 set's provenance is a paragraph of over 1,000 characters; it reads as lines."""
    assert stoker_main(["predict", model_dir]) == 0
    out = capsys.readouterr().out
    assert "fitted on: mixes six hosts" in out
    assert max(len(line) for line in out.splitlines() if not line.startswith("model: ")) <= 120  # a path


def test_json_with_a_service_file_and_a_cold_cache(
    model_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([model_dir, "-f", str(EXAMPLES / "tensor-parallel.yaml"), "--cache", "miss", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    prediction = document["prediction"]
    assert document["hardware"] == "NVIDIA-H100-80GB-HBM3_x2_v0.26"
    assert prediction["coefficientSet"] == "NVIDIA-H100-80GB-HBM3_x1_v0.26"
    assert document["settings"]["tensorParallel"] == 2 and document["settings"]["cacheState"] == "miss"
    assert "compile" in prediction["phases"] and "compileLoad" not in prediction["phases"]
    assert prediction["totalSeconds"] == pytest.approx(sum(prediction["phases"].values()), abs=0.01)
    assert document["facts"]["layers"] == LLAMA_CONFIG["num_hidden_layers"]


def test_weights_on_a_volume_are_predicted_read_ahead_with_instanttensor(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "on-a-volume.yaml"
    manifest.write_text(yaml.safe_dump(ON_A_VOLUME))
    assert main([model_dir, "-f", str(manifest), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["settings"]["readAhead"] and document["settings"]["loader"] == "instanttensor"
    assert document["regimes"]["bootstrap"] == "readahead=gentle,pages,nogc"
    assert document["regimes"]["weightLoad"] == "loader=instanttensor,readahead,gentle"
    assert not document["prediction"]["fallbacks"]


def test_an_eager_service_compiles_nothing(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([model_dir, "-f", str(EXAMPLES / "eager.yaml"), "--json", "--hardware", "cpu_x0_v0.26"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert not {"dynamo", "compile", "compileLoad"} & set(document["prediction"]["phases"])
    assert document["hardware"] == "cpu_x0_v0.26"


def test_a_directory_without_weights_is_predicted_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    assert main([str(tmp_path)]) == 0
    assert "no weights" in capsys.readouterr().err


def test_bad_model_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent")]) == EXIT_UNREADABLE
    assert "cannot read config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("[1, 2")
    assert main([str(tmp_path)]) == EXIT_UNREADABLE
    assert "not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "status", "message"),
    [
        (None, EXIT_UNREADABLE, "cannot read"),
        ("a: [1", EXIT_UNREADABLE, "is not valid YAML"),
        ("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n", EXIT_INVALID, "holds 0 VLLMServices"),
        ("apiVersion: stoker.dev/v1\nkind: VLLMService\n", EXIT_INVALID, "needs apiVersion"),
        (
            "apiVersion: stoker.dev/v1alpha1\nkind: VLLMService\nmetadata: {name: x}\nspec: {model: {}}\n",
            EXIT_INVALID,
            "VLLMService is invalid",
        ),
    ],
)
def test_bad_service_files(
    model_dir: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    status: int,
    message: str,
) -> None:
    manifest = tmp_path / "service.yaml"
    if content is not None:
        manifest.write_text(content)
    assert main([model_dir, "-f", str(manifest)]) == status
    assert message in capsys.readouterr().err


def test_a_garbled_hardware_key(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([model_dir, "--hardware", "H100"]) == EXIT_UNREADABLE
    assert "is not <gpu product>_x<gpu count>_v<major.minor>" in capsys.readouterr().err
