"""The driver of a run: one attempt (lease, resume check, start, the trainer's body, the result), the Ray Train
launcher (RayTrainer) and the one-process LocalTrainer, preflight before Ray, scale-up on an autoscaled cluster,
Ray Tune sweeps, experiment tracking, and `raytrain report`.

May import: errors, platform, lifecycle, rundir, data, spec, parallel, checkpoint, worker, loop, models
"""
