"""What runs on a training worker: `raytrain.Session` (the contract around any loop), its data feed, its step
control (mid-epoch checkpoints, stops, drains, resizes agreed at step boundaries), the Ray Train function contract,
an elastic run's resize, a node's drain probe, and the live metrics.

May import: errors, platform, lifecycle, rundir, data, spec, parallel, checkpoint
"""
