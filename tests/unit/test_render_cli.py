"""`stoker render FILE`: the children of each VLLMService in a file, as multi-document YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stoker.render.cli import main, render_manifest_yaml

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_examples_exist() -> None:
    names = {path.stem for path in EXAMPLES}
    assert {"minimal", "gated-token", "pvc-weights", "tensor-parallel", "eager", "multi-replica"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_render(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(path)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [document["kind"] for document in documents]
    assert kinds[0] == "PersistentVolumeClaim"
    assert kinds[-2:] == ["Deployment", "Service"]
    assert "Job" in kinds


def test_several_documents_and_other_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    minimal = (EXAMPLES[0].parent / "minimal.yaml").read_text()
    second = minimal.replace("name: qwen-small", "name: qwen-other")
    secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n"
    path = tmp_path / "all.yaml"
    path.write_text("\n---\n".join([minimal, secret, second]))
    assert main([str(path)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    services = [d["metadata"]["name"] for d in documents if d["kind"] == "Service"]
    assert services == ["qwen-small", "qwen-other"]


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ("{gpus: 3, tensorParallelSize: 2}", "tensorParallelSize must divide gpus"),
        ("{image: registry/vllm:latest}", "names no vLLM version in its tag: set spec.runtime.engineVersion"),
        ("{image: vllm/vllm-openai:v0.40.0}", "vLLM 0.40.0 is not supported; supported releases: 0.22-0.23"),
        (
            "{extraArgs: [--max-batch-size, '8']}",
            "spec.runtime.extraArgs[0]: --max-batch-size is not an option",
        ),
    ],
    ids=["tensor-parallel-not-dividing-gpus", "untagged-image", "unsupported-version", "unknown-extra-arg"],
)
def test_a_service_stoker_refuses_renders_nothing_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runtime: str, message: str
) -> None:
    path = tmp_path / "refused.yaml"
    path.write_text(
        "apiVersion: stoker.dev/v1alpha1\nkind: VLLMService\nmetadata: {name: refused}\n"
        f"spec: {{model: {{name: m}}, runtime: {runtime}}}\n"
    )
    assert main([str(path)]) == 1
    output = capsys.readouterr()
    assert message in output.err and output.out == ""


def test_nothing_to_render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    assert main([str(path)]) == 1
    assert main([str(tmp_path / "missing.yaml")]) == 2
    capsys.readouterr()


def test_render_manifest_yaml() -> None:
    manifest = yaml.safe_load((EXAMPLES[0].parent / "eager.yaml").read_text())
    documents = list(yaml.safe_load_all(render_manifest_yaml(manifest)))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert "--enforce-eager" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


GOOD = (
    "apiVersion: stoker.dev/v1alpha1\nkind: VLLMService\nmetadata: {name: good}\nspec: {model: {name: m}}\n"
)

MISTAKES = {
    "old apiVersion": (
        GOOD.replace("stoker.dev/v1alpha1", "stoker.dev/v1"),
        "apiVersion 'stoker.dev/v1' and kind 'VLLMService'; a VLLMService needs apiVersion"
        " 'stoker.dev/v1alpha1'",
    ),
    "lower-case kind": (GOOD.replace("kind: VLLMService", "kind: vllmservice"), "kind 'vllmservice'"),
    "plural kind": (GOOD.replace("kind: VLLMService", "kind: VLLMServices"), "kind 'VLLMServices'"),
    "kind of another group's spelling": (
        GOOD.replace("stoker.dev/v1alpha1", "apps/v1"),
        "apiVersion 'apps/v1' and kind 'VLLMService'",
    ),
    "no apiVersion": (
        GOOD.replace("apiVersion: stoker.dev/v1alpha1\n", ""),
        "document 1 (good) has no apiVersion",
    ),
    "no kind": (GOOD.replace("kind: VLLMService\n", ""), "has no kind"),
    "not a mapping": ("- a\n- b\n", "document 1 is a list, not a Kubernetes object"),
    "syntax error": ("apiVersion: [unclosed\n", "is not valid YAML"),
    "empty file": ("", "is empty"),
    "only separators": ("---\n---\n", "is empty"),
}


@pytest.mark.parametrize(("text", "message"), MISTAKES.values(), ids=MISTAKES.keys())
def test_mistakes_exit_non_zero_naming_what_was_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    assert main([str(path)]) in (1, 2)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


def test_every_bad_document_is_reported_and_nothing_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_version = GOOD.replace("name: good", "name: old").replace("v1alpha1", "v2")
    bad_spec = GOOD.replace("name: good", "name: broken").replace("{name: m}", "{name: -m}")
    path = tmp_path / "several.yaml"
    path.write_text("---\n".join([GOOD, bad_version, bad_spec]))
    assert main([str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "document 2 (old) has apiVersion 'stoker.dev/v2'" in captured.err
    assert "document 3 (broken): VLLMService is invalid" in captured.err
    assert "must not start with '-'" in captured.err


def test_a_missing_file_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent.yaml")]) == 2
    assert f"cannot read {tmp_path / 'absent.yaml'}: No such file or directory" in capsys.readouterr().err


def test_a_binary_file_is_not_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert main([str(path)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


def test_a_directory_cannot_be_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert f"cannot read {tmp_path}: Is a directory" in capsys.readouterr().err
