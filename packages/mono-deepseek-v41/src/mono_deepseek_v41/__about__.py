"""Version of the mono-deepseek-v41 distribution (static: hatchling reads it)."""

__version__ = "0.1.0"
