"""Version of the mono-glm53-flash distribution (static: hatchling reads it)."""

__version__ = "0.2.1"
