"""The architecture's rules, checked on the source with `ast` (nothing is imported, so each
module runs in a fraction of a second and fails on the first edge that breaks a rule). One module
per rule, or per group of closely related rules:

* test_layers.py: every import goes down the layers (LAYERS between packages; MODULE_LAYERS within
  config/ and composition/), and there is no import cycle among jaxserve modules, nor among
  packages (jaxserve.X, pallas_kernels);
* test_host_device.py: the device side (device/, pallas_kernels/, attention/, models/,
  parallel/) imports nothing from the host side (engine/, core/, server/, structured/, tools/,
  bench/, entrypoints/llm.py, cli/) nor from the composition root (composition/,
  entrypoints/follower.py); what crosses the seam (messages/) imports no jax and nothing else of
  jaxserve; the host side (every module of engine/: scheduler (with its admission of waiting
  requests, decode bursts, prefix-cache page bookkeeping and step plan), page allocator,
  requests, batch builder, admission rules, the engine loop, which reaches the device side
  through the protocols of engine/device_port.py) imports no jax, directly or through any
  jaxserve module it imports;
* test_tpu_aot.py: jaxserve/tpu_aot reaches the device side and the engine through
  tpu_aot/step_programs.py alone;
* test_investigations.py: investigations/ (one-off device investigations, not installed) may
  import jaxserve, never the reverse: no jaxserve or pallas_kernels module imports it, and pip
  does not install it;
* test_server.py: server/ is HTTP only: it reaches neither jax nor the device side nor the
  composition root (the `serve` command hands the process to core/serve.py, the one edge not
  followed), starts no process (no multiprocessing, subprocess or os.fork), and core/ imports
  nothing of it;
* test_explicit_imports.py: imports are explicit (no __import__);
* test_tests_mirror.py: tests/<folder> mirrors a package;
* test_top_level.py: the top level of jaxserve/ holds at most 6 modules (TOP_LEVEL names them,
  each with why);
* test_subcommands.py: one subcommand dispatch: only config/subcommands.py calls argparse's
  add_subparsers (every command, at every level, is a record of a table);
* test_configuration.py: no configuration outside config/: no other module is named for it,
  reads YAML, defines a *Config / *Args / *Settings class or adds a `--set` override
  (NOT_CONFIGURATION: what only looks like configuration, each with why);
* test_families.py: no family flag outside the family modules (jaxserve/models/families/):
  nothing else reads a family attribute (`config.gemma`), compares or looks up a config's
  `architecture`, or compares with (or keys a table by) a family's name, model type or Hugging
  Face architecture name (the names are read from the families' `ModelFamily(...)` records); a
  family's specifics are its module's choices;
* test_request_record.py: one request record across the wire: engine/core_io.EngineCoreRequest
  is built in one place, engine/core_io.new_core_requests (where a prompt's ids become one
  checked tuple), and no module copies a record's prompt ids into a list
  (`list(x.prompt_token_ids)`; `tuple()` of the tuple is the tuple itself);
* test_measures.py: the numbers docs/ARCHITECTURE.md's "The tree in numbers" states
  (measures.py counts them, walk.py reads the request's walk) are today's, and stay within their
  ceilings.

Each policy's one owner (one definition, rows read by column name, no decision by a backend's
name) is tests/test_one_owner.py's. The import graph and the `ast` walks all of them share are
tests/source_graph.py; the scopes several rules name (host, device, composition root, server,
investigations) are scopes.py.

Imports are read everywhere in a module, function bodies included: a function-local import is
an edge like any other.
"""
