"""Every store implements the whole ``Store`` protocol, and the engine never probes one.

The protocol (``qbuild.core.protocols.Store``) names every capability the engine uses;
mypy --strict checks the stores against it (``test_typing``). These checks add what the
type checker lets through: parameter names (a caller may pass any argument by name),
members found only through ``__getattr__``, a docstring per member; and, on the source,
that no module asks a store what it is or whether it has a method, and that diskcache's
internals stay inside ``qbuild/store/local.py``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import diskcache

from qbuild.core.protocols import Store
from qbuild.store.http import RemoteConfig
from qbuild.store.local import LocalStore
from qbuild.store.remote import LayeredStore

ROOT = Path(__file__).resolve().parents[2]
STORES = (LocalStore, LayeredStore)
"""Every class of the engine named ``...Store`` but the protocol: each must implement it."""
SCANNED = ("qbuild", "tests", "bench", "plugins")
# diskcache's own private members (its SQL connection and helpers, its Disk): nothing
# but qbuild/store/local.py reaches into a diskcache object.
DISKCACHE_PRIVATE = {"_sql", "_sql_retry", "_con", "_transact", "_txn_id", "_row_insert",
                     "_row_update", "_select_delete", "_cull", "_disk", "_page_size"}


def _methods() -> dict[str, object]:
    return {name: value for name, value in vars(Store).items()
            if not name.startswith("_") and (inspect.isfunction(value)
                                             or isinstance(value, property))}


def _attributes() -> set[str]:
    return set(Store.__annotations__)


def _parameters(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(function).parameters.values()]


def test_the_protocol_declares_each_member_with_a_docstring():
    methods = _methods()
    assert {"lock_action", "prefetch_actions", "action_texts", "link_blob", "trusts",
            "vouch", "discard_blob", "defer_sync", "put_results", "remote_usable"} <= set(
        methods)
    for name, member in methods.items():
        function = member.fget if isinstance(member, property) else member
        assert inspect.getdoc(function), f"Store.{name} has no docstring"
    assert _attributes() == {"directory", "tmp"}


def test_every_store_class_is_checked_here():
    found = set()
    for path in (ROOT / "qbuild").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Store"):
                found.add(node.name)
    assert found - {"Store"} == {cls.__name__ for cls in STORES}


def test_each_store_implements_every_member_with_the_same_parameters():
    for cls in STORES:
        # A member found only through __getattr__ is one the type checker cannot see.
        assert inspect.getattr_static(cls, "__getattr__", None) is None, cls
        for name, member in _methods().items():
            mine = inspect.getattr_static(cls, name, None)
            assert mine is not None, f"{cls.__name__} lacks Store.{name}"
            if isinstance(member, property):
                assert isinstance(mine, property), f"{cls.__name__}.{name} is no property"
                continue
            assert inspect.isfunction(mine), f"{cls.__name__}.{name} is no method"
            assert _parameters(mine) == _parameters(member), f"{cls.__name__}.{name}"


def test_each_store_has_the_protocol_attributes(tmp_path):
    local = LocalStore(tmp_path / "cache")
    layered = LayeredStore(local, RemoteConfig(url="http://127.0.0.1:9"))
    try:
        for store in (local, layered):
            for name in _attributes():
                assert isinstance(vars(store).get(name), Path), (type(store).__name__, name)
        assert layered.directory == local.directory and layered.tmp == local.tmp
    finally:
        layered.close()


def _diskcache_handles(tmp_path: Path) -> set[str]:
    """The attributes of a LocalStore holding its diskcache objects."""
    store = LocalStore(tmp_path / "cache")
    try:
        return {name for name, value in vars(store).items()
                if isinstance(value, diskcache.Cache)}
    finally:
        store.close()


def _sources():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _mentions_store(node: ast.expr) -> bool:
    return "store" in ast.unparse(node).lower()


def test_no_module_probes_a_store_or_touches_diskcache_internals(tmp_path):
    handles = _diskcache_handles(tmp_path)
    assert handles  # (the check below would pass vacuously otherwise)
    members = set(_methods()) | _attributes()
    found = []
    for rel, tree in _sources():
        in_store = rel.startswith("qbuild/store/")
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    not in_store and node.args:
                name, first = node.func.id, node.args[0]
                probed = node.args[1] if len(node.args) > 1 else None
                if name in ("getattr", "hasattr") and (_mentions_store(first) or (
                        isinstance(probed, ast.Constant) and probed.value in members)):
                    found.append(f"{where}: {ast.unparse(node)}")
                if name in ("isinstance", "issubclass") and probed is not None and \
                        "Store" in ast.unparse(probed):
                    found.append(f"{where}: {ast.unparse(node)}")
            if isinstance(node, ast.Compare) and not in_store and any(
                    isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Call) and isinstance(s.func, ast.Name)
                       and s.func.id == "type" for s in sides) and \
                        any("Store" in ast.unparse(s) for s in sides):
                    found.append(f"{where}: {ast.unparse(node)}")
            if isinstance(node, ast.Attribute) and rel != "qbuild/store/local.py":
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if node.attr in DISKCACHE_PRIVATE or (node.attr in handles and not own):
                    found.append(f"{where}: {ast.unparse(node)}")
            if isinstance(node, (ast.Import, ast.ImportFrom)) and rel.startswith("qbuild/") \
                    and rel != "qbuild/store/local.py":
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module or ""]
                if any(n.split(".")[0] == "diskcache" for n in names):
                    found.append(f"{where}: imports diskcache")
    assert not found, "\n".join(found)
