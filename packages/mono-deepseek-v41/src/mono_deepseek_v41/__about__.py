"""Version of the mono-deepseek-v41 distribution (static: hatchling reads it)."""

__version__ = "0.2.1"
