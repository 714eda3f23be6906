"""Version of the mono-common distribution (static: hatchling reads it)."""

__version__ = "0.1.22"
