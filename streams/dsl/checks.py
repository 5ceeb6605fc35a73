"""Checks of what the DSL's calls are given, made when the app is built: a value where a
function belongs (``branch("amount > 100")``), or a function that cannot take the arguments
its step calls it with (``filter(lambda value: ...)``), fails there, naming the call, rather
than as one dead letter per record once the app runs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from streams.dsl.topology import TopologyError

C = TypeVar("C", bound=type)

#: What the DSL's functions are called with, for the error that says a function cannot be.
_ARGUMENTS = {
    ("filter", "predicate"): "key, value", ("filter_not", "predicate"): "key, value",
    ("map", "fn"): "key, value", ("map_values", "fn"): "value",
    ("flat_map", "fn"): "key, value", ("flat_map_values", "fn"): "value",
    ("select_key", "fn"): "key, value", ("group_by", "key_selector"): "key, value",
    ("group_by", "selector"): "key, value", ("aggregate", "initializer"): "no arguments",
    ("aggregate", "aggregator"): "key, value, aggregate", ("reduce", "reducer"):
    "aggregate, value", ("aggregate", "merger"): "key, aggregate, aggregate",
    ("aggregate", "adder"): "key, value, aggregate",
    ("aggregate", "subtractor"): "key, value, aggregate",
    ("join", "joiner"): "left value, right value",
    ("left_join", "joiner"): "left value, right value",
    ("outer_join", "joiner"): "left value, right value",
}


def _function_parameters(method: Callable[..., Any]) -> dict[str, tuple[bool, int | None]]:
    """The parameters of ``method`` that take a function (annotated ``Callable[...]``, or
    ``Callable[...] | None``), each with whether None is allowed and how many arguments the
    function is called with (None for ``Callable[..., R]``: it varies)."""
    found: dict[str, tuple[bool, int | None]] = {}
    for name, param in inspect.signature(method).parameters.items():
        annotation = param.annotation
        if not isinstance(annotation, str):
            continue
        alternatives = [a.strip() for a in annotation.split(" | ")]
        if alternatives and alternatives[0].startswith("Callable[") and all(
                a == "None" for a in alternatives[1:]):
            found[name] = ("None" in alternatives[1:], _arity(alternatives[0]))
    return found


def _arity(annotation: str) -> int | None:
    """How many arguments ``Callable[[A, B], R]`` takes: 2 (None for ``Callable[..., R]``)."""
    inner = annotation[len("Callable["):]
    if not inner.startswith("["):
        return None
    depth, count, empty = 0, 1, True
    for char in inner[1:]:
        if char == "[":
            depth += 1
        elif char == "]":
            if depth == 0:
                return 0 if empty else count
            depth -= 1
        elif char == "," and depth == 0:
            count += 1
        elif not char.isspace():
            empty = False
    return None


def arity_problem(fn: Callable[..., Any], arguments: int) -> str | None:
    """Why ``fn`` cannot be called with ``arguments`` positional arguments, or None when it
    can (or its signature cannot be read: a builtin type, say)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*([None] * arguments))
    except TypeError as exc:
        return str(exc)
    return None


def check_arity(call: str, fn: Callable[..., Any], arguments: int, shape: str) -> None:
    """A :class:`TopologyError` when ``fn`` cannot be called with ``arguments`` positional
    arguments, as ``shape`` (``predicate(key, value)``) shows it is."""
    problem = arity_problem(fn, arguments)
    if problem is not None:
        raise TopologyError(f"{call}: {shape.split('(')[0]} is called as {shape}, but "
                            f"{getattr(fn, '__name__', repr(fn))} cannot be: {problem}")


def _checked(owner: str, method: Callable[..., Any]) -> Callable[..., Any]:
    parameters = _function_parameters(method)
    if not parameters:
        return method
    signature = inspect.signature(method)

    @functools.wraps(method)
    def check_then_call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        for name, (optional, arguments) in parameters.items():
            if name not in bound.arguments:
                continue
            given = bound.arguments[name]
            values = given if signature.parameters[name].kind is (
                inspect.Parameter.VAR_POSITIONAL) else (given,)
            for value in values:
                if optional and value is None:
                    continue
                if not callable(value):
                    raise TopologyError(
                        f"{owner}.{method.__name__}(): {name} must be a function, not "
                        f"{type(value).__name__} {value!r:.60}")
                if arguments is not None:
                    described = _ARGUMENTS.get((method.__name__, name),
                                               f"{arguments} arguments")
                    check_arity(f"{owner}.{method.__name__}()", value, arguments,
                                f"{name}({'' if described == 'no arguments' else described})")
        return method(*args, **kwargs)

    return check_then_call


def functions_checked(cls: C) -> C:
    """Wrap every public method of ``cls`` that takes functions so that each is checked to
    be callable when the method is called."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        wrapped = _checked(cls.__name__, member)
        if wrapped is not member:
            setattr(cls, name, wrapped)
    return cls
