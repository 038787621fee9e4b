"""Before Ray starts: the model component is built once on torch's meta device, so a constructor that refuses its
arguments is one paragraph naming the model section, not a failure in every worker after Ray's restarts."""

from __future__ import annotations

import pytest

from raytrain import preflight
from raytrain.config import ConfigError, load_config


@pytest.mark.parametrize("model, fragments", [
    ("{_component_: vit, image_size: 32, patch_size: 5}", ["raytrain.models.vit(", "patch_size=5",
                                                          "patch_size 5 does not divide image_size 32"]),
    ("{_component_: vit, hidden_dim: 30, num_heads: 4}", ["num_heads 4 does not divide hidden_dim 30"]),
])
def test_a_model_that_cannot_be_built_is_named_before_ray(tmp_path, model, fragments):
    path = tmp_path / "job.yaml"
    path.write_text(f"model: {model}\ndata: {{_component_: raytrain.data.cifar10.CIFAR10, synthetic: true}}\n")
    cfg = load_config(str(path))
    with pytest.raises(ConfigError) as caught:
        preflight.check_model_builds(cfg)
    message = str(caught.value)
    assert message.startswith(f"{path}: model: ") and "Fix: correct the model section" in message
    for fragment in fragments:
        assert fragment in message


def test_a_model_that_builds_passes_without_allocating(tmp_path):
    import resource

    path = tmp_path / "job.yaml"
    path.write_text("model: {_component_: vit, num_layers: 48, hidden_dim: 1024, mlp_dim: 4096, num_heads: 16}\n"
                    "data: {_component_: raytrain.data.cifar10.CIFAR10, synthetic: true}\n")
    cfg = load_config(str(path))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    preflight.check_model_builds(cfg)  # ~600 M parameters, 2.4 GB as float32: the meta device holds none of it
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500 * 1024  # KiB
