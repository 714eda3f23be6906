"""Which SGLang releases mono supports, checked at run time without importing sglang.

sglang is not a dependency of any mono package (it comes from the server's
environment), so the supported range is enforced here, where a plugin
registers, and reported by `mono doctor`.
"""

from __future__ import annotations

from importlib import metadata

# The monokernel contract (MONOKERNEL_API_VERSION 1) is pinned to 0.5.23:
# any other release must be checked against the contract tests first.
SUPPORTED_SGLANG = ((0, 5, 23), (0, 5, 24))  # [low, high)
SUPPORTED_SGLANG_TEXT = ">=0.5.23,<0.5.24"
MONOKERNEL_API_VERSION = 1


class UnsupportedSGLang(RuntimeError):
    """The installed SGLang is missing or outside the supported range."""


def _release_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(parts) == 3:
            break
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def installed_sglang_version() -> str | None:
    """The installed sglang distribution's version, or None when it is absent."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def sglang_problem(version: str | None = "__installed__") -> str | None:
    """Why the given (default: installed) SGLang cannot be used, or None when it can."""
    if version == "__installed__":
        version = installed_sglang_version()
    if version is None:
        return (
            "sglang is not installed: install sglang "
            f"{SUPPORTED_SGLANG_TEXT} in the server's environment"
        )
    low, high = SUPPORTED_SGLANG
    release = _release_tuple(version)
    if not (low <= release < high):
        return (
            f"sglang {version} is not supported: mono needs sglang {SUPPORTED_SGLANG_TEXT} "
            f"(monokernel API version {MONOKERNEL_API_VERSION})"
        )
    return None


def require_supported_sglang() -> str:
    """Return the installed SGLang version, or raise `UnsupportedSGLang` saying what is needed."""
    problem = sglang_problem()
    if problem is not None:
        raise UnsupportedSGLang(problem)
    version = installed_sglang_version()
    assert version is not None
    return version
