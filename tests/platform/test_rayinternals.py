"""Every Ray internal raytrain touches (raytrain.platform.rayinternals), checked against the pinned Ray: a Ray upgrade that
moves one fails here, naming it. The GCS drain probe against a real two-node cluster is in the integration tier
(tests/integration/test_rayinternals.py)."""

from __future__ import annotations

import inspect
import json
import logging

import pytest
from ray.autoscaler._private.util import format_readonly_node_type

from raytrain.platform import rayinternals

READONLY_TYPE = format_readonly_node_type("10.0.0.1")


def test_ray_trains_report_logger_is_named_after_its_module_file():
    from ray.train.v2._internal.execution import context

    rayinternals.quiet_report_logs()
    assert logging.getLogger(context.__file__).level == logging.WARNING


def test_the_thread_warning_that_is_silenced_is_still_what_ray_says():
    import ray._private.worker as worker

    assert "SIGTERM handler is not set" in inspect.getsource(worker)


def test_the_gcs_calls_exist_with_the_arguments_used():
    from ray._raylet import GcsClient, InnerGcsClient
    from ray.core.generated import autoscaler_pb2, gcs_pb2, gcs_service_pb2

    assert "node_selectors" in InnerGcsClient.get_all_node_info.__doc__
    assert hasattr(GcsClient, "__init__") and hasattr(InnerGcsClient, "drain_node")
    assert "node_id" in {f.name for f in gcs_service_pb2.GetAllNodeInfoRequest.NodeSelector.DESCRIPTOR.fields}
    assert "state_snapshot" in {f.name for f in gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields}
    assert gcs_pb2.NodeSnapshot.State.Value("DRAINING")
    assert autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")


def test_this_node_is_none_outside_a_ray_worker():
    assert rayinternals.this_node() is None


def test_ray_trains_worker_actor_is_one_of_the_titles_looked_for():
    from ray.train.v2._internal.execution.worker_group import worker

    assert any(title == f"ray::{name}" for title in rayinternals.TRAIN_WORKER_TITLES
               for name, _ in inspect.getmembers(worker, inspect.isclass))


def test_the_raylet_flags_read_from_proc_are_the_ones_ray_start_passes():
    from ray._private import services

    source = inspect.getsource(services.start_raylet)
    for flag in ("--node_id", "--node_ip_address", "--gcs-address", "--session_dir", "--temp_dir",
                 "--static_resource_list"):
        assert f'"{flag}=' in source or f"'{flag}=" in source or f"{flag}=" in source, flag
    cmd = ["/x/raylet", "--node_id=ab", "--node_ip_address=10.0.0.2", "--gcs-address=10.0.0.1:6379",
           "--session_dir=/tmp/ray/s", "--temp_dir=/tmp/ray", "--static_resource_list=node:__internal_head__,1"]
    [raylet] = rayinternals.local_raylets({42: (1, 0.0, cmd)})
    assert (raylet.pid, raylet.node_id, raylet.gcs_address, raylet.is_head) == (42, "ab", "10.0.0.1:6379", True)


@pytest.mark.parametrize(("status", "expected"), [
    (None, None),  # the monitor has not written yet
    (b"", None),
    (json.dumps({"load_metrics_report": {}}).encode(), None),  # written before the autoscaler's first summary
    (json.dumps({"autoscaler_report": {"node_type_mapping": {}}}).encode(), None),  # no node listed yet
    (json.dumps({"autoscaler_report": {"node_type_mapping": None}}).encode(), None),
    # An autoscaling config's node types: it can add nodes.
    (json.dumps({"autoscaler_report": {"node_type_mapping": {"10.0.0.1": "headgroup"}}}).encode(), True),
    # A read-only monitor names each node's type after the node itself.
    (json.dumps({"autoscaler_report": {"node_type_mapping": {"10.0.0.1": READONLY_TYPE}}}).encode(), False),
])
def test_a_v1_monitor_status_says_it_can_add_nodes_only_once_it_lists_a_node(status, expected):
    assert rayinternals.v1_monitor_can_add_nodes(status) is expected


def test_the_coordinator_refresher_ships_by_value_and_loads_where_raytrain_cannot_be_imported(tmp_path):
    """Ray's AutoscalingCoordinator is a detached actor started by whichever job came first: the function sent to
    it must not need raytrain there (cloudpickle ships nested functions by value)."""
    import subprocess
    import sys

    from ray import cloudpickle

    blob = tmp_path / "refresher.pkl"
    blob.write_bytes(cloudpickle.dumps(rayinternals.coordinator_refresher()))
    probe = ("import sys, pickle; sys.modules['raytrain'] = None\n"  # any `import raytrain...` now fails
             f"refresh = pickle.loads(open({str(blob)!r}, 'rb').read())\n"
             "import threading\n"
             "class Coordinator:  # the attributes Ray's actor has (checked against Ray below)\n"
             "    _lock = threading.RLock(); _cluster_node_resources = {None: {'n1': {'CPU': 1.0}}}\n"
             "    def _update_cluster_node_resources(self): pass\n"
             "    def _refresh_resource_reservations(self): pass\n"
             "c = Coordinator(); print(refresh(c), c._get_cluster_nodes.__name__)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["1", "nodes_not_draining"], done.stdout + done.stderr
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        _AutoscalingCoordinatorActor as Actor,
    )
    for name in ("_update_cluster_node_resources", "_refresh_resource_reservations", "_tick"):
        assert callable(getattr(Actor, name)), name
    source = inspect.getsource(Actor)
    assert "self._get_cluster_nodes = get_cluster_nodes" in source and "self._lock = threading.RLock()" in source
    # Grouped by subcluster ({label value: {node id: resources}}), which the refresher's count sums over
    assert "self._cluster_node_resources: Dict[Optional[LabelValue], NodeResources]" in source


def test_the_torchft_backend_raytrain_copies_is_the_pinned_rays():
    """rayinternals.torchft_config copies Ray's _TorchftBackend._maybe_create_lighthouse_actor for two changes (a
    Lighthouse that asks for no CPU, reached by IP): the copied shape must still be Ray's."""
    from ray.train.v2.torch.torchft_config import LighthouseServerActor, _TorchftBackend

    source = inspect.getsource(_TorchftBackend._maybe_create_lighthouse_actor)
    for piece in ("self.lighthouse_actor", 'if "bind" in backend_config.lighthouse_kwargs', '{"bind": "[::]:0"}',
                  "LighthouseServerActor.options(", "NodeAffinitySchedulingStrategy(", "soft=False",
                  "ray.get(self.lighthouse_actor.address.remote())"):
        assert piece in source, piece
    assert "num_cpus" not in source  # Ray's asks for the default CPU: the reason for raytrain's copy
    assert hasattr(LighthouseServerActor, "options") and _TorchftBackend.has_replica_groups
    config = rayinternals.torchft_config({"min_replicas": 1})
    assert issubclass(config.backend_cls, _TorchftBackend) and config.lighthouse_kwargs == {"min_replicas": 1}


def test_the_token_auth_notice_of_an_embedded_ray_is_quiet_and_nothing_else(caplog):
    """Ray 2.60 warns on every local ray.init() that it turned token auth on: raytrain keeps that off its console
    (the logger and the words are the pinned Ray's), and every other line of that logger through."""
    import logging

    from ray._private.authentication import authentication_token_setup as setup

    assert "Token authentication is enabled for this Ray cluster" in inspect.getsource(setup._warn_token_auth_enabled)
    rayinternals.quiet_token_auth_notice()
    logger = logging.getLogger(setup.__name__)
    with caplog.at_level(logging.WARNING, logger=setup.__name__):
        setup._warn_token_auth_enabled()
        logger.warning("Token authentication is disabled for this Ray cluster.")
    assert [r.getMessage()[:40] for r in caplog.records] == ["Token authentication is disabled for thi"]
