"""Every Kube method that sends a write to the API server calls the leader's fence first (leader.py): a method
added later without it would let a replica whose term passed write beside the next leader."""

from __future__ import annotations

import ast
import inspect
import re

from stoker.controller import kube

# Client calls that change the cluster: the dynamic client's verbs and the typed clients' *_namespaced_*.
WRITE_CALL = re.compile(r"^(create|patch|delete|replace|server_side_apply)(_|$)")


def client_writes(method: ast.FunctionDef) -> list[str]:
    """The write calls a method makes on a client object (not through another method of self)."""
    return [
        node.func.attr
        for node in ast.walk(method)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and WRITE_CALL.match(node.func.attr)
        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
    ]


def calls_the_fence_first(method: ast.FunctionDef) -> bool:
    body = method.body[1:] if ast.get_docstring(method) is not None else method.body
    first = body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Call)
        and ast.unparse(first.value.func) == "self._fenced"
    )


def test_every_write_method_calls_the_fence_first() -> None:
    (cls,) = [
        node
        for node in ast.parse(inspect.getsource(kube)).body
        if isinstance(node, ast.ClassDef) and node.name == "Kube"
    ]
    methods = [node for node in cls.body if isinstance(node, ast.FunctionDef)]
    writers = {method.name: client_writes(method) for method in methods if client_writes(method)}
    assert {"apply", "create", "_patch", "delete", "post_event"} <= set(writers)
    unfenced = [
        method.name for method in methods if method.name in writers and not calls_the_fence_first(method)
    ]
    assert not unfenced, f"Kube methods that write without calling self._fenced() first: {unfenced}"
