"""The Kubernetes half: render the Helm chart, validate charts and manifests (`raytrain validate`), run a RayJob
as KubeRay would on local Ray clusters (`raytrain emulate`), and Ray on plain machines (`raytrain cluster`).
The rooms and their order are in docs/architecture.md.

May import: errors, rundir, spec
"""
