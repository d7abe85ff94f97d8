"""edgetune: tools for tuning and auditing fleets of edge AI devices."""

__version__ = "0.1.0"
