"""Typed providers: what a target tells its dependents, beyond its files.

A provider is a frozen dataclass subclassing ``Provider``. Rules declare the providers
they give (``Rule.provides``), their actions return instances, and dependents read them
typed (``dep[OnnxModelInfo]``). Values are stored in the action cache as JSON: plain
values, lists and tables of them, and ``Path``s to the target's own outputs (kept
relative to its output folder and resolved to real paths in the dependent's sandbox).

A provider is named by ``module.QualName`` (``provider_name``): the name keys storage,
so renaming or moving a class is a new provider.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..core.errors import RuleError

_FILE = "$file"


class Provider:
    """Base class of every provider. Subclass it as a frozen dataclass::

        @dataclass(frozen=True)
        class ReportInfo(qbuild.Provider):
            report: Path          # one of the target's outputs
            mean: float
            labels: tuple[str, ...] = ()

    Fields hold JSON values (str, int, float, bool, None, lists/tuples and tables of
    them) or ``Path``s to outputs of the target giving the provider. Sequences come back
    to dependents as tuples.
    """

    __provider_name__: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__provider_name__ = f"{cls.__module__}.{cls.__qualname__}"


def provider_name(cls: type[Provider]) -> str:
    """The stable name of a provider class (``module.QualName``)."""
    return cls.__provider_name__


def check_provider_class(cls: Any, where: str) -> None:
    """Raise TypeError unless ``cls`` is a frozen dataclass subclassing Provider."""
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise TypeError(f"{where}: {cls!r} is not a qbuild.Provider subclass")
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__dataclass_fields__" not in cls.__dict__:
        raise TypeError(f"{where}: provider {cls.__qualname__} must be declared with "
                        "@dataclass(frozen=True)")


P = TypeVar("P", bound="Provider")
"""A provider class, for typed reads (``dep[OnnxModelInfo]`` is an ``OnnxModelInfo``)."""


@dataclasses.dataclass(frozen=True)
class DefaultInfo(Provider):
    """The files of a target (its declared outputs, in order): every target has it."""

    files: tuple[Path, ...] = ()


def _encode(value: Any, out_root: Path, where: str) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise RuleError(f"{where} is {value}; providers hold finite numbers")
        return value
    if isinstance(value, Path):
        try:
            rel = value.resolve().relative_to(out_root.resolve())
        except ValueError:
            raise RuleError(f"{where} is the path {value.name!r}, which is not one of this "
                            "target's outputs; providers may only point at outputs") from None
        return {_FILE: rel.as_posix()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, out_root, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or key == _FILE:
                raise RuleError(f"{where} has the key {key!r}; tables need string keys "
                                f"other than {_FILE!r}")
            out[key] = _encode(item, out_root, f"{where}[{key!r}]")
        return out
    raise RuleError(f"{where} holds a {type(value).__name__}; providers hold JSON values "
                    "and output paths")


def encode(provider: Provider, out_root: Path) -> tuple[str, dict[str, Any]]:
    """(name, JSON data) of a provider an action returned; paths become relative to
    ``out_root`` (the target's output folder in the sandbox)."""
    cls = type(provider)
    check_provider_class(cls, "returned provider")
    data = {f.name: _encode(getattr(provider, f.name), out_root,
                            f"{cls.__qualname__}.{f.name}")
            for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return provider_name(cls), data


def _decode(value: Any, root: Path | None) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v, root) for v in value)
    if isinstance(value, dict):
        if set(value) == {_FILE}:
            rel = value[_FILE]
            return (root / rel) if root is not None else Path(rel)
        return {k: _decode(v, root) for k, v in value.items()}
    return value


def decode(cls: type[P], data: Mapping[str, Any], root: Path | None) -> P:
    """A provider instance from stored data, paths resolved under ``root``."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: _decode(v, root) for k, v in data.items() if k in names}
    return cls(**values)


def returned_providers(value: Any, out_root: Path, declared: tuple[type[Provider], ...]
                       ) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """Split what an action returned into (legacy info dict or None, providers by name).

    Accepts None, a dict (info), a Provider, or a list/tuple of Providers and at most
    one dict. Every provider must be declared by the rule (``provides``)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    info: dict[str, Any] | None = None
    providers: dict[str, dict[str, Any]] = {}
    allowed = {provider_name(p) for p in declared}
    for item in items:
        if item is None:
            continue
        if isinstance(item, dict):
            if info is not None:
                raise RuleError("the action returned two info dicts")
            info = item
            continue
        if not isinstance(item, Provider):
            raise RuleError(f"the action returned {type(item).__name__}; expected providers "
                            "(or an info dict)")
        name, data = encode(item, out_root)
        if name not in allowed:
            shown = ", ".join(p.__qualname__ for p in declared) or "none"
            raise RuleError(f"the action returned {type(item).__qualname__}, which the rule "
                            f"does not declare in provides (declared: {shown})")
        if name in providers:
            raise RuleError(f"the action returned {type(item).__qualname__} twice")
        providers[name] = data
    return info, providers
