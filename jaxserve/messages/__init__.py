"""What crosses the seam between the host side (engine/) and the device side (device/): plain
data, no jax, so a message can later travel between processes."""
