"""edgetune reference runtime (see ../README.md for the contract)."""
__version__ = "0.1.2"
