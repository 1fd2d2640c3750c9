"""The ahead-of-time TPU build: the server's step programs compiled for a TPU topology on any host.

`jaxserve compile-tpu` (cli.py) builds the programs `jaxserve serve` would run on a TPU slice from
abstract weights and KV pages (jax.ShapeDtypeStruct with the partition rules' shardings on a mesh
of topology devices, chips.py), lowers them with the Pallas TPU kernels and compiles them with
libtpu, then checks the memory a chip needs against its HBM (memory.py). step_programs.py is the
only module that touches the engine's device side (device/, parallel/: the public step-program
builder, the placement, the KV pool's sizing); build.py compiles, report.py prints.
"""
