"""training/raytrain/spec/sizing.py: sizing workers to the cluster, and failing fast when a job can never be scheduled."""

from __future__ import annotations

import pytest

from raytrain.errors import LaunchError
from raytrain.spec.config import load_config
from raytrain.spec.sizing import (auto_cpus_per_worker, data_reserve, grown_per_worker, scale_up_bundles, size_workers, workers_that_fit)


@pytest.mark.parametrize("nodes, workers, reserve, expected", [
    ([2.0], 3, 0.0, 0.5),  # a 2-core laptop: 3 workers at half a CPU
    ([2.0], 2, 0.0, 1.0),
    ([2.0], 2, 1.0, 0.5),  # one CPU kept for Ray Data's tasks
    ([0.0, 1.0, 1.0], 3, 0.0, 0.5),  # a KubeRay head with num-cpus 0 and two 1-CPU workers
    ([16.0], 4, 1.0, 1.0),
])
def test_auto_cpus_per_worker(nodes, workers, reserve, expected):
    assert auto_cpus_per_worker(nodes, workers, reserve) == expected


def test_workers_fit_per_node_not_in_total():
    nodes = [{"CPU": 1.5}, {"CPU": 1.5}]
    assert workers_that_fit(nodes, {"CPU": 1.0}) == 2  # 3 CPUs in total, but no node holds two
    assert workers_that_fit(nodes + [{"CPU": 4, "GPU": 1}], {"CPU": 1.0, "GPU": 1.0}) == 1


def test_a_job_that_can_never_fit_fails_with_a_fix():
    cfg = load_config("linear", ["scaling.cpus_per_worker=2"])
    with pytest.raises(LaunchError) as caught:
        size_workers(cfg, [{"CPU": 2.0}, {"CPU": 1.0}])
    message = str(caught.value)
    assert "can never be scheduled" in message and "hold at most 1" in message
    assert "scaling.num_workers" in message


def test_gpu_jobs_need_gpu_nodes():
    cfg = load_config("linear", ["scaling.use_gpu=true", "scaling.num_workers=2", "train.batch_size=24"])
    with pytest.raises(LaunchError, match="GPU 1"):
        size_workers(cfg, [{"CPU": 8.0}])
    assert size_workers(cfg, [{"CPU": 8.0, "GPU": 2.0}]) == {"CPU": 1.0, "GPU": 1.0}


def test_ray_data_keeps_a_cpu_only_where_there_is_more_than_one():
    ray_cfg = load_config("digits", ["data.loader=ray"])
    assert ray_cfg.data.loader == "ray"
    assert data_reserve(ray_cfg, [{"CPU": 2.0}]) == 1.0
    assert data_reserve(ray_cfg, [{"CPU": 1.0}]) == 0.0
    assert data_reserve(load_config("linear"), [{"CPU": 8.0}]) == 0.0


@pytest.mark.parametrize("overrides, expected", [
    ([], {"CPU": 1.0}),  # auto: its cap, not a share of the head alone
    (["scaling.cpus_per_worker=2"], {"CPU": 2.0}),
    (["scaling.use_gpu=true", "scaling.num_workers=2", "train.batch_size=24"], {"CPU": 1.0, "GPU": 1.0}),
])
def test_a_cluster_that_can_grow_sizes_workers_at_their_full_size(overrides, expected):
    assert grown_per_worker(load_config("linear", overrides)) == expected


def test_the_autoscaler_is_asked_for_every_worker_and_ray_datas_cpu():
    linear = load_config("linear")
    bundles = scale_up_bundles(linear, {"CPU": 1.0})
    assert bundles == [{"CPU": 1}] * 3 and all(type(v) is int for b in bundles for v in b.values())  # Ray's type
    assert scale_up_bundles(linear, {"CPU": 0.5, "GPU": 1.0}) == [{"CPU": 1, "GPU": 1}] * 3
    digits = load_config("digits", ["data.loader=ray"])  # data.loader: ray keeps a CPU for Ray Data's tasks
    assert scale_up_bundles(digits, {"CPU": 1.0}) == [{"CPU": 1}] * digits.scaling.num_workers + [{"CPU": 1}]


def test_auto_never_thins_a_worker_below_a_quarter_cpu():
    """64 workers on a 2-CPU laptop were admitted at 1/32 CPU each and never trained: now they cannot be scheduled."""
    cfg = load_config("linear", ["scaling.num_workers=64", "train.batch_size=64"])
    with pytest.raises(LaunchError) as caught:
        size_workers(cfg, [{"CPU": 2.0}])
    assert "at least 0.25 CPU" in str(caught.value) and "hold at most 8" in str(caught.value)
    cfg = load_config("linear", ["scaling.num_workers=8", "train.batch_size=64"])
    assert size_workers(cfg, [{"CPU": 2.0}]) == {"CPU": 0.25}
