"""docs/api.md: generated from the models, complete, and committed as generated."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stoker.api.crd import build_crd
from stoker.api.docs import DOCS_PATH, main, reference

REPO = Path(__file__).resolve().parents[2]


def schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def fields(node: dict[str, Any], path: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(section path, field name, field schema) for every named field under `node`."""
    if node.get("type") == "array":
        yield from fields(node.get("items") or {}, path + "[]")
    for name, child in (node.get("properties") or {}).items():
        yield path, name, child
        yield from fields(child, f"{path}.{name}")


def section(text: str, path: str) -> str:
    match = re.search(rf"^### `{re.escape(path)}`\n(.*?)(?=^### |\Z)", text, re.S | re.M)
    assert match, f"no section for {path}"
    return match.group(1)


def test_committed_reference_matches_a_regeneration() -> None:
    committed = (REPO / DOCS_PATH).read_text(encoding="utf-8")
    assert committed == reference(), "docs/api.md is stale: run `python -m stoker.api.docs`"


def test_every_field_has_a_row_in_its_section() -> None:
    text = reference()
    root = schema()
    for part in ("spec", "status"):
        for path, name, child in fields(root["properties"][part], part):
            row = next(
                (line for line in section(text, path).splitlines() if line.startswith(f"| `{name}` |")),
                None,
            )
            assert row, f"{path}.{name} missing"
            if "default" in child:
                assert "`" in row.split("|")[3], f"{path}.{name} lost its default"


def test_every_cel_rule_message_is_documented() -> None:
    text = reference()

    def messages(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations") or []:
                yield rule["message"]
            for value in node.values():
                yield from messages(value)
        elif isinstance(node, list):
            for value in node:
                yield from messages(value)

    found = list(messages(schema()))
    assert found
    for message in found:
        assert message in text, message


def test_table_cells_never_break_a_row() -> None:
    for line in reference().splitlines():
        if line.startswith("| `"):
            unescaped_pipes = len(re.findall(r"(?<!\\)\|", line))
            assert unescaped_pipes == 5, line


def test_main_writes_the_reference_under_root(tmp_path: Path) -> None:
    assert main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / DOCS_PATH).read_text(encoding="utf-8") == reference()


def test_generator_imports_without_cluster_libraries() -> None:
    code = (
        "import sys, stoker.api.docs; "
        "print(sorted(m for m in ('yaml', 'kopf', 'kubernetes') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- Argo CD health check


def argocd_health_script() -> str:
    text = (REPO / "docs" / "gitops.md").read_text(encoding="utf-8")
    match = re.search(
        r"resource\.customizations\.health\.stoker\.dev_VLLMService: \|\n((?: {4}.*\n|\n)+)", text
    )
    assert match, "docs/gitops.md has no VLLMService health check"
    return "\n".join(line[4:] for line in match.group(1).splitlines())


def service(generation: int, observed: int | None, **conditions: tuple[str, str]) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"generation": generation}}
    if observed is not None:
        obj["status"] = {
            "observedGeneration": observed,
            "conditions": [
                {"type": kind, "status": status, "reason": reason, "message": f"{kind} says {reason}"}
                for kind, (status, reason) in conditions.items()
            ],
        }
    return obj


HEALTH_CASES = [
    (service(1, None), "Progressing"),
    (service(2, 1, Ready=("True", "ReplicasReady")), "Progressing"),
    (service(1, 1, Ready=("True", "ReplicasReady"), Degraded=("False", "AsExpected")), "Healthy"),
    (service(1, 1, Ready=("True", "ReplicasReady"), Degraded=("True", "CompileCacheMiss")), "Healthy"),
    (service(1, 1, Ready=("True", "ReplicasReady"), Degraded=("True", "ApplyFailed")), "Degraded"),
    (service(1, 1, Ready=("False", "InvalidSpec"), Degraded=("True", "InvalidSpec")), "Degraded"),
    (service(1, 1, Ready=("False", "RollingOut"), Degraded=("True", "SeedFailed")), "Degraded"),
    (service(1, 1, Ready=("False", "WaitingForSeed"), Degraded=("False", "AsExpected")), "Progressing"),
    (service(1, 1, Ready=("False", "RollingOut")), "Progressing"),
]


@pytest.mark.parametrize(("obj", "expected"), HEALTH_CASES)
def test_argocd_health_check_reads_the_conditions(obj: dict[str, Any], expected: str) -> None:
    lupa = pytest.importorskip("lupa", reason="lupa (Lua in Python) runs Argo CD's Lua health check")
    runtime = lupa.LuaRuntime()
    check = runtime.eval(f"function(obj)\n{argocd_health_script()}\nend")
    health = check(runtime.table_from(obj, recursive=True))
    assert health["status"] == expected, health["message"]
    assert health["message"]


# ------------------------------------------------------------------------------ the pages and links

DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page (fenced code blocks skipped)."""
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"(?m)^#{1,6} (.+?)\s*$", text):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: a regex in one is no link
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_index_links_every_page_under_docs() -> None:
    index = DOCS / "index.md"
    linked = {(DOCS / target.partition("#")[0]).resolve() for target in relative_links(index)}
    unlinked = [
        str(path.relative_to(DOCS))
        for path in sorted(DOCS.rglob("*"))
        if path.suffix in {".md", ".json"} and path != index and path.resolve() not in linked
    ]
    assert not unlinked, f"docs/index.md does not link {unlinked}"


def test_the_readme_links_the_index_and_the_generated_reference() -> None:
    targets = relative_links(REPO / "README.md")
    assert "docs/index.md" in targets
    assert str(DOCS_PATH) in targets
