"""The local cluster: real Ray nodes on this machine as a RayCluster's pods (`raytrain emulate`), or on plain
machines (`raytrain cluster`). Above the validator (it reads a spec's shape) and the training runtime.

May import: errors, platform, rundir, spec, validator
"""
