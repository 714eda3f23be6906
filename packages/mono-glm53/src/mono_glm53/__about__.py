"""Version of the mono-glm53 distribution (static: hatchling reads it)."""

__version__ = "0.3.26"
