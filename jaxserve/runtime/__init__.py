"""The process and the machine it runs on: the device's description (device_description.py), its
memory statistics as JAX reports them (memory_stats.py), logging (log_setup.py), the garbage
collector's pauses (gc_pauses.py) and the optional dependencies a command checks before it works
(optional_deps.py). Leaves: nothing here imports another jaxserve package, so every layer may
use them."""
