"""raytrain: distributed PyTorch training with Ray Train, on KubeRay clusters or an embedded local Ray."""

__version__ = "0.1.0"
