"""Two fixes to what vLLM's imports do twice or needlessly, applied in the serving process right after the
module that has each runs, with the same results (issue 40; measured in bench/results/import-fixes-cpu.txt):

- transformers 5 builds the lazy import structure of `transformers.models` by reading and scanning all of
  its ~2,600 files. `create_import_structure_from_path` is cached, but its two callers pass the directory
  once as a Path and once as the path of its `__init__.py`, so the scan runs twice. The fix gives both the
  same key, and each caller its own copy (callers update what they get).
- torch's `torch._library.utils.get_source` names a fake kernel's registration site with
  `inspect.getframeinfo(frame)`, whose default context reads the caller's source lines and resolves the
  module of every new `sys.modules` entry. It runs once per registration (about 150 while vLLM imports) and
  only keeps the file name and line number, which `getframeinfo(frame, context=0)` gives alike.

Each fix is applied only where the module still has the shape it was written for; otherwise the module is
left as it is. `install` returns the list it fills with the modules fixed, for the program's log line.
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

TRANSFORMERS_IMPORT_UTILS = "transformers.utils.import_utils"
TORCH_LIBRARY_UTILS = "torch._library.utils"


def scan_models_once(module: ModuleType) -> bool:
    scan = getattr(module, "create_import_structure_from_path", None)
    if scan is None or not hasattr(scan, "cache_info"):
        return False

    def create_import_structure_from_path(module_path: Any) -> Any:
        path = os.fspath(module_path)
        if os.path.isfile(path):
            path = os.path.dirname(path)
        if os.path.basename(path) == "models":
            return copy.deepcopy(scan(path))
        return scan(module_path)

    setattr(module, "create_import_structure_from_path", create_import_structure_from_path)  # noqa: B010
    return True


def source_without_context(module: ModuleType) -> bool:
    original = getattr(module, "get_source", None)
    try:
        parameters = list(inspect.signature(original).parameters) if callable(original) else []
    except (TypeError, ValueError):  # no signature to read (a builtin): not the function this was written for
        return False
    if parameters != ["stacklevel"]:
        return False

    def get_source(stacklevel: int) -> str:
        frame = inspect.getframeinfo(sys._getframe(stacklevel), context=0)
        return f"{frame.filename}:{frame.lineno}"

    get_source.__doc__ = original.__doc__
    setattr(module, "get_source", get_source)  # noqa: B010
    return True


FIXES: dict[str, Callable[[ModuleType], bool]] = {
    TRANSFORMERS_IMPORT_UTILS: scan_models_once,
    TORCH_LIBRARY_UTILS: source_without_context,
}


class _AfterExec(importlib.abc.Loader):
    """Runs the module as its own loader would, then its fix; the module keeps its own loader."""

    def __init__(self, loader: importlib.abc.Loader, fix: Callable[[ModuleType], bool], applied: list[str]):
        self.loader, self.fix, self.applied = loader, fix, applied

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)  # get_source, get_filename, is_package, ...

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        if self.fix(module):
            self.applied.append(module.__name__)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, applied: list[str]):
        self.applied = applied

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        fix = FIXES.get(fullname)
        if fix is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterExec(spec.loader, fix, self.applied)
                return spec
        return None


def install() -> list[str]:
    """Fix each module of FIXES when it is imported from now on; the list fills with the names fixed."""
    applied: list[str] = []
    sys.meta_path.insert(0, _Finder(applied))
    return applied
