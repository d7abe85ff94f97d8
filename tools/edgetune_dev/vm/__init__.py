"""VM twins: a real kernel booted by a real bootloader under qemu (software emulation)."""
