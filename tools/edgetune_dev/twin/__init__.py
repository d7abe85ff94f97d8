"""Device twins: systemd containers that look like one board at the real paths."""
