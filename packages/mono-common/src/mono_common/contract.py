"""The SGLang contract checker: resolves every name a module lists in `SGLANG_READS`.

Each mono module that reads SGLang (a function, a class, an attribute, a
ForwardBatch field) lists the dotted name in a module-level `SGLANG_READS`
tuple. `missing_names` imports the longest importable module prefix of each
name and walks the rest with getattr, so an SGLang upgrade that renames or
drops anything fails the contract test with the exact names.

A name may end in a `#field` part for a dataclass/struct field or an
instance attribute that only exists on instances (e.g.
"sglang.srt.model_executor.forward_batch_info.ForwardBatch#out_cache_loc"):
it is checked against the class's annotations, dataclass fields, msgspec
struct fields or `__slots__`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ContractReport:
    """The result of checking one module's `SGLANG_READS`."""

    module: str
    checked: int
    missing: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.missing

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.module}: cannot check: {self.error}"
        if not self.missing:
            return f"{self.module}: {self.checked} SGLang names resolve"
        return f"{self.module}: missing in the installed SGLang: " + ", ".join(self.missing)


def _field_names(obj: object) -> set[str]:
    names: set[str] = set()
    for klass in getattr(obj, "__mro__", (obj,)):
        # Read the class's own __dict__: inherited descriptors (on `type`) are not field lists.
        own = getattr(klass, "__dict__", {})
        for key in ("__annotations__", "__dataclass_fields__", "__struct_fields__", "__slots__"):
            value = own.get(key, ())
            if isinstance(value, str):
                value = (value,)
            if isinstance(value, (dict, tuple, list, frozenset, set)):
                names.update(value)
    return names


def resolve(name: str) -> object:
    """Import and getattr a dotted SGLang name; raise LookupError naming what is missing."""
    dotted, _, field_part = name.partition("#")
    parts = dotted.split(".")
    obj: object | None = None
    used = 0
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            missing_mod = exc.name or ""
            if missing_mod and not ".".join(parts[:cut]).startswith(missing_mod):
                # A dependency of the module is missing: that is an environment
                # problem, not a renamed SGLang name.
                raise LookupError(f"{name}: importing needs {missing_mod!r}") from exc
            continue
        used = cut
        break
    if obj is None:
        raise LookupError(f"{name}: no importable module prefix")
    for attr in parts[used:]:
        if not hasattr(obj, attr):
            raise LookupError(f"{name}: {type(obj).__name__} has no attribute {attr!r}")
        obj = getattr(obj, attr)
    if field_part:
        if not hasattr(obj, field_part) and field_part not in _field_names(obj):
            raise LookupError(f"{name}: {dotted} has no field {field_part!r}")
    return obj


def missing_names(names: Iterable[str]) -> tuple[str, ...]:
    """The names among `names` that do not resolve in the installed SGLang."""
    missing = []
    for name in names:
        try:
            resolve(name)
        except LookupError:
            missing.append(name)
    return tuple(missing)


def check_module(module_name: str) -> ContractReport:
    """Import `module_name` and resolve its `SGLANG_READS` against the installed SGLang."""
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - report any import failure as a contract error
        return ContractReport(module_name, 0, error=f"import failed: {exc!r}")
    reads = getattr(module, "SGLANG_READS", None)
    if reads is None:
        return ContractReport(module_name, 0, error="the module has no SGLANG_READS")
    bad = [n for n in reads if not isinstance(n, str) or not n.startswith("sglang.")]
    if bad:
        return ContractReport(module_name, 0, error=f"SGLANG_READS holds non-sglang names {bad}")
    return ContractReport(module_name, len(reads), missing=missing_names(reads))


def check_modules(module_names: Iterable[str]) -> list[ContractReport]:
    """`check_module` for each name, in order."""
    return [check_module(m) for m in module_names]
