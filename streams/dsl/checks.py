"""Checks of what the DSL's calls are given, made when the app is built: a value where a
function belongs (``branch("amount > 100")``) fails there, naming the call, rather than as
one dead letter per record once the app runs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from streams.dsl.topology import TopologyError

C = TypeVar("C", bound=type)


def _function_parameters(method: Callable[..., Any]) -> dict[str, bool]:
    """The parameters of ``method`` that take a function (annotated ``Callable[...]``, or
    ``Callable[...] | None``), each with whether None is allowed."""
    found: dict[str, bool] = {}
    for name, param in inspect.signature(method).parameters.items():
        annotation = param.annotation
        if not isinstance(annotation, str):
            continue
        alternatives = [a.strip() for a in annotation.split(" | ")]
        if alternatives and alternatives[0].startswith("Callable[") and all(
                a == "None" for a in alternatives[1:]):
            found[name] = "None" in alternatives[1:]
    return found


def _checked(owner: str, method: Callable[..., Any]) -> Callable[..., Any]:
    parameters = _function_parameters(method)
    if not parameters:
        return method
    signature = inspect.signature(method)

    @functools.wraps(method)
    def check_then_call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        for name, optional in parameters.items():
            if name not in bound.arguments:
                continue
            given = bound.arguments[name]
            values = given if signature.parameters[name].kind is (
                inspect.Parameter.VAR_POSITIONAL) else (given,)
            for value in values:
                if callable(value) or (optional and value is None):
                    continue
                raise TopologyError(
                    f"{owner}.{method.__name__}(): {name} must be a function, not "
                    f"{type(value).__name__} {value!r:.60}")
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
