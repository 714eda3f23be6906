"""Refuses to install the repository root: it is a monorepo, not a package.

The root pyproject.toml holds tool settings only. Without this file pip's
setuptools fallback would build an empty "packages" distribution from it.
"""

raise SystemExit(
    "the mono repository root is not a package: install one of packages/mono-common, "
    "packages/mono-glm53, packages/mono-glm53-flash or packages/mono-deepseek-v41"
)
