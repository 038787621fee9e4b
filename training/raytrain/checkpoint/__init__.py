"""Checkpoints of a run: the protocol (save at a position, the newest loadable, prune), the single-file and the
sharded (torch.distributed.checkpoint) checkpointers, directory checkpoints a Ray Train function reports, the
resume rules checked from the driver, and `raytrain export`.

May import: errors, lifecycle, rundir, spec, parallel
"""
