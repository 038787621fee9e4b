"""raytrain: distributed PyTorch training with Ray Train, on KubeRay clusters or an embedded local Ray.

The public API for a training loop of your own is `raytrain.Session` (see raytrain.worker.session); everything else a
user touches is the `raytrain` command and the run config.

May import: worker, data
"""

__version__ = "0.1.0"

__all__ = ["Session", "DataSource", "DataContext", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `raytrain --help` and `raytrain validate` import nothing they do not use.
    if name == "Session":
        from raytrain.worker.session import Session

        return Session
    if name in ("DataSource", "DataContext"):
        from raytrain import data

        return getattr(data, name)
    raise AttributeError(f"module 'raytrain' has no attribute {name!r}")
