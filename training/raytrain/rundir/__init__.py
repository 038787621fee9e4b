"""The run directory STORAGE/NAME and everything written in it: the storage backend (a directory or an s3://, gs://
prefix; the only room that knows which), where checkpoints are staged and how they are committed on either, the
atomic file write, the lease and its fence, the run control that carries a stop request, the records (config,
metrics, steps, events, results) and the console's driver-log copy.

May import: errors, platform, lifecycle
"""
