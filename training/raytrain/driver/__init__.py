"""The driver of a run: one attempt (lease, resume check, start, the trainer's body, the result), the Ray Train
launcher (RayTrainer) and the one-process LocalTrainer, the checks before Ray (preflight), the run's start (lease,
resume check, start record), the data prepared in the driver, the runtime env that ships the user's code, scale-up
on an autoscaled cluster, Ray Tune sweeps, the experiment trackers and their syncer, and `raytrain report`.

May import: errors, platform, lifecycle, rundir, data, spec, parallel, checkpoint, worker, loop, models
"""
