"""The run spec: the run config (defaults, file, smoke block, overrides, cross-checks), its `_component_`
references checked against the callables' signatures, the one YAML reader, the options of `raytrain run`/`local`/
`tune`, the user's project directory on the import path, the kind of loop a config names, worker sizing against a
cluster's nodes, the builders of the config's components, and what scaling.fsdp_wrap may name in a built-in
model (fsdp_units). Torch-free: `raytrain validate` reads specs with it.

May import: errors, rundir, data
"""
