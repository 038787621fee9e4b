"""What raytrain touches below Python's own library: this machine's processes (/proc: trees, who holds a path,
exact kills of what we started) and every private Ray internal it relies on (the GCS client, a worker's node and
session directory, Ray Train's logger, the raylet's flags), each with a test against the pinned Ray.

May import: errors
"""
