"""stoker.inpod.import_fixes' mechanics on stand-in modules: a fix runs right after its module executes,
only where the module has the shape it was written for, and what callers get is what they got before."""

from __future__ import annotations

import functools
import sys
import textwrap
from pathlib import Path

import pytest

from stoker.inpod import import_fixes

SCANNER = """
    import functools, os
    scans = []
    @functools.lru_cache
    def create_import_structure_from_path(module_path):
        scans.append(module_path)
        return {"models": {os.path.basename(os.path.dirname(str(module_path)) or "x"): set()}}
"""
SOURCE = """
    import inspect, sys
    def get_source(stacklevel: int) -> str:
        frame = inspect.getframeinfo(sys._getframe(stacklevel))
        return f"{frame.filename}:{frame.lineno}"
"""


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bodies = {"standin_scanner": SCANNER, "standin_source": SOURCE, "standin_other": "x = 1"}
    for name, body in bodies.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    fixes = {
        "standin_scanner": import_fixes.scan_models_once,
        "standin_source": import_fixes.source_without_context,
        "standin_other": import_fixes.source_without_context,
    }
    monkeypatch.setattr(import_fixes, "FIXES", fixes)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in fixes:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_the_models_directory_is_scanned_once_and_each_caller_gets_its_own_copy(stand_ins: Path) -> None:
    applied = import_fixes.install()
    import standin_scanner  # type: ignore[import-not-found]

    models = stand_ins / "models"
    models.mkdir()
    (models / "__init__.py").write_text("")
    first = standin_scanner.create_import_structure_from_path(models)
    second = standin_scanner.create_import_structure_from_path(str(models / "__init__.py"))
    assert standin_scanner.scans == [str(models)]
    assert first == second and first is not second
    assert applied == ["standin_scanner"]
    # The module keeps its own loader (inspect, linecache and importlib.resources ask it).
    assert type(standin_scanner.__loader__).__name__ == "SourceFileLoader"
    assert standin_scanner.__spec__.loader is standin_scanner.__loader__


def test_the_source_names_the_same_caller_without_reading_its_lines(stand_ins: Path) -> None:
    import_fixes.install()
    import standin_source  # type: ignore[import-not-found]

    def register() -> str:
        return standin_source.get_source(2)

    assert register() == f"{__file__}:{sys._getframe().f_lineno}"


def test_a_module_of_another_shape_is_left_as_it_is(stand_ins: Path) -> None:
    applied = import_fixes.install()
    import standin_other  # type: ignore[import-not-found]

    assert standin_other.x == 1 and not hasattr(standin_other, "get_source")
    assert applied == []


def test_an_uncached_scanner_is_not_wrapped() -> None:
    module = type(sys)("uncached")
    module.create_import_structure_from_path = functools.partial(dict)
    assert import_fixes.scan_models_once(module) is False


def test_a_get_source_without_a_signature_is_left_as_it_is() -> None:
    module = type(sys)("builtin_source")
    module.get_source = getattr  # a builtin: inspect.signature cannot read it
    assert import_fixes.source_without_context(module) is False
    assert module.get_source is getattr
