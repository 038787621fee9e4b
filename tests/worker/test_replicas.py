"""raytrain.worker.replicas against real torchft, in one process: a Lighthouse and two replicas (each its own
torchft Manager, TCPStore and gloo process group) on threads, as Ray Train's TorchftConfig would place them on two
workers. Checks the step's arithmetic (the gradient mean over every sample the replicas trained), the commit, the
quorum's size, which replica writes, and a late replica's heal from its peer's state."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from raytrain.platform.rayinternals import by_ip
from raytrain.worker import replicas


@pytest.fixture
def lighthouse():
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=500, heartbeat_timeout_ms=1000)
    yield server.address()
    server.shutdown()


def _replica(rank: int, lighthouse: str, events: list) -> replicas.Replicas:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    made = replicas.Replicas(rank, torch.device("cpu"), "127.0.0.1",
                             on_event=lambda event, **fields: events.append((rank, event, fields)),
                             store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=lighthouse)
    made._store_server = store  # kept alive as long as the replica
    made.manager._timeout = timedelta(seconds=20)
    return made


def _both(fn_a, fn_b) -> list:
    out: list = [None, None]
    errors: list = []

    def run(i, fn):
        try:
            out[i] = fn()
        except BaseException as err:  # noqa: BLE001 - raised below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((fn_a, fn_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def _model(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 1)


def test_two_replicas_average_by_samples_commit_and_a_late_one_heals_from_its_peer(lighthouse):
    events: list = []
    a, b = _replica(0, lighthouse, events), _replica(1, lighthouse, events)
    try:
        ma, mb = _model(0), _model(0)
        states = {}
        for r, m in ((a, ma), (b, mb)):
            r.state_fn = lambda m=m: {"model": m.state_dict(), "position": {"epoch": 3, "micro": 7}}
            r.load_fn = lambda heal, m=m, r=r: (m.load_state_dict(heal.state["model"]), states.update({r.rank: heal}))

        def step(r, m, grad, samples):
            r.quorum()
            m.weight.grad = torch.full_like(m.weight, grad)
            m.bias.grad = torch.full_like(m.bias, grad)
            return r.reduce(list(m.parameters()), samples, micro=2)

        ra, rb = _both(lambda: step(a, ma, 1.0, 3.0), lambda: step(b, mb, 5.0, 1.0))
        assert ra.committed and rb.committed and ra.participants == rb.participants == 2
        # (1*3 + 5*1) / 4 samples: the mean over every sample, not over the replicas
        assert torch.allclose(ma.weight.grad, torch.full_like(ma.weight, 2.0)) and \
            torch.allclose(mb.bias.grad, torch.full_like(mb.bias, 2.0))
        assert ra.samples == rb.samples == 4.0 and ra.micro == 2
        assert a.writer and not b.writer  # the quorum's first replica writes the run's records
        assert a.epoch.row() == {"samples": 4, "replica_steps": 1, "replica_steps_retried": 0,
                                 "replicas_min": 2, "replicas_max": 2}

        # b goes away: a trains on alone, says so, and writes on
        b.shutdown()
        b = None
        with torch.no_grad():
            ma.weight.add_(1.0)  # a's own progress, which the replacement must receive
        alone = step(a, ma, 1.0, 2.0)
        assert alone.committed and alone.participants == 1 and a.writer
        assert (0, "replicas", {"participants": 1, "previous": 2, "step": 1}) in events

        # a replacement of rank 1 joins with other weights: it heals from a (weights and position) in its quorum
        c, mc = _replica(1, lighthouse, events), _model(99)
        c.state_fn = lambda: {"model": mc.state_dict()}
        c.load_fn = lambda heal: (mc.load_state_dict(heal.state["model"]), states.update({1: heal}))
        def trained(r, m, grad, samples):  # a step and its optimizer's update (plain SGD), if it commits
            result = step(r, m, grad, samples)
            if result.committed:
                with torch.no_grad():
                    for p in m.parameters():
                        p.sub_(0.1 * p.grad)
            return result

        def survivor():  # trains on, step after step, until the replacement takes part in one of them
            while True:
                result = trained(a, ma, 1.0, 2.0)
                if result.participants == 2:
                    return result

        def replacement():
            c.quorum()
            result = c.reduce(list(mc.parameters()), 0.0, 0)
            c.heal_again()  # what the session does after its first step: its peer stepped, it could not
            return result

        a.end_epoch()  # counting from here: the steps of the join
        got = _both(survivor, replacement)
        assert got[0].committed and got[1].committed and got[1].participants == 2
        # in the quorum of two, only the survivor trained: the step counts one replica and its samples
        assert a.epoch.row()["replicas_max"] == 1 and a.epoch.samples == 2.0 * a.epoch.committed
        heal = states.pop(1)
        assert heal.state["position"] == {"epoch": 3, "micro": 7} and heal.step >= 2
        assert got[0].samples == 2.0 and not c.writer and a.writer
        # the next step heals it again, from the survivor's state after the step it could not take: from then on
        # both hold the same parameters
        _both(lambda: trained(a, ma, 1.0, 2.0), lambda: trained(c, mc, 3.0, 2.0))
        assert 1 in states and all(torch.equal(p, q) for p, q in zip(ma.parameters(), mc.parameters()))
        assert a.epoch.row()["replicas_max"] == 2  # both trained in that one
        # exactly one writer at every step of the join (the survivor: the joining one decides nothing while healing)
        assert a.writer and not c.writer
        assert _both(lambda: a.in_sync(ma), lambda: c.in_sync(mc)) == [True, True]
        assert _both(lambda: a.all_reduce([1.0, 2.0], "sum"), lambda: c.all_reduce([3.0, 4.0], "sum")) == \
            [([4.0, 6.0], True), ([4.0, 6.0], True)]
        c.shutdown()
    finally:
        a.shutdown()


@pytest.fixture
def alone(lighthouse):
    """One replica of its own quorum, with a model, its state bound."""
    a, m = _replica(0, lighthouse, []), _model(1)
    a.state_fn, a.load_fn = (lambda: {"model": m.state_dict()}), (lambda heal: None)
    yield a, m
    a.shutdown()


def test_a_step_with_no_samples_anywhere_changes_no_gradient_and_counts_no_step(alone):
    a, m = alone
    a.quorum()
    before = [None if p.grad is None else p.grad.clone() for p in m.parameters()]
    result = a.reduce(list(m.parameters()), 0.0, 0)
    assert result.committed and result.samples == 0
    assert [p.grad for p in m.parameters()] == before  # none: nothing was trained
    assert a.epoch.row()["replica_steps"] == 0


def test_flags_travel_with_the_next_step_and_come_back_summed(alone):
    a, m = alone
    a.share_flags([0.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # a stop request seen between steps
    a.quorum()
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    result = a.reduce(list(m.parameters()), 1.0, 1)
    assert result.flags[1] == 1.0 and result.flags[0] == 0.0
    a.quorum()
    assert a.reduce(list(m.parameters()), 1.0, 1).flags[1] == 0.0  # sent once, with one committed step


@pytest.mark.parametrize("address, ip, expected", [
    ("http://vm:41461", "10.0.0.2", "http://10.0.0.2:41461"),
    ("http://[::1]:5", "fe80::1", "http://[fe80::1]:5"),
    ("http://pod-abc.default.svc:29510", "192.168.4.7", "http://192.168.4.7:29510"),
    ("http://vm", "1.2.3.4", "http://1.2.3.4"),
])
def test_the_lighthouse_address_names_the_nodes_ip_not_its_host_name(address, ip, expected):
    assert by_ip(address, ip) == expected


def test_the_lighthouse_settings_go_on_with_one_replica_and_notice_a_loss_in_a_second():
    assert replicas.lighthouse_kwargs() == {"min_replicas": 1, "heartbeat_timeout_ms": 1000, "join_timeout_ms": 60000}


def test_under_torchft_a_stop_reaches_every_replica_but_a_drain_ends_only_its_own():
    """Session._ft_share: the stop (and checkpoint, lease-lost) flags every replica sent with the last committed step
    decide for all of them; a node's drain is that replica's alone (Ray Train replaces it, the others train on)."""
    from types import SimpleNamespace

    from raytrain.worker.session import Session

    sent = []
    me = SimpleNamespace(replicas=SimpleNamespace(share_flags=sent.append),
                         _ft_result=replicas.StepResult(True, 4.0, 2, flags=[0.0, 1.0, 0.0, 0.0, 1.0, 0.0]))
    # this replica: its node drains, nothing else; the last step carried a peer's stop and a peer's drain
    decided = Session._ft_share(me, [0.0, 0.0, 0.0, 3.0, 1.0, 0.0])
    assert decided == [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]  # the stop for all, its own drain, a decision every step
    assert sent == [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]  # its drain is not sent to the others
    me._ft_result = replicas.StepResult(True, 4.0, 2, flags=[0.0, 0.0, 0.0, 0.0, 2.0, 0.0])
    assert Session._ft_share(me, [0.0] * 6)[4] == 0.0  # a peer's drain does not end this one
    me._ft_result = replicas.StepResult(False, 0.0, 2, flags=[1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    assert Session._ft_share(me, [0.0] * 6) == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # an uncommitted step decides nothing


def test_the_writer_stays_with_the_survivor_while_rank_0_rejoins_and_then_moves_back():
    """Replicas.quorum's writer rule with a scripted Manager: rank 1 wrote while rank 0 was lost; the replacement of
    rank 0 heals at two quorums in a row; every step has exactly one writer."""

    class Scripted:
        def __init__(self, replica, script):
            self.replica, self.script = replica, iter(script)

        def start_quorum(self):
            self.now = next(self.script)
            if self.now[2]:
                self.replica._load({"model": {}})

        def num_participants(self):
            return self.now[0]

        def participating_rank(self):
            return self.now[1]

        def current_step(self):
            return 7

    def replica(rank, writer, participants, script):
        made = object.__new__(replicas.Replicas)
        made.rank, made.on_event, made.load_fn, made.healed = rank, None, None, None
        made.writer, made.participants, made._joining = writer, participants, 0
        made._manager = Scripted(made, script)
        return made

    # (participants, participating rank, heals): the replacement joins, heals again, then both train
    survivor = replica(1, True, 1, [(2, 1, False), (2, 1, False), (2, 1, False), (2, 1, False)])
    joining = replica(0, True, 0, [(2, 0, True), (2, 0, True), (2, 0, False), (2, 0, False)])
    writers = []
    for _ in range(4):
        survivor.quorum()
        joining.quorum()
        writers.append((survivor.writer, joining.writer))
    assert writers == [(True, False), (True, False), (False, True), (False, True)]

    # A starting group whose rank 1 reached the first quorum alone (rank 0 still building its model): rank 1 writes
    # from that first quorum on (the group's start event is its), while rank 0 heals in twice; then rank 0 again.
    first = replica(1, False, 0, [(1, 0, False), (2, 0, False), (2, 0, False), (2, 1, False)])
    late = replica(0, True, 0, [(2, 0, True), (2, 0, True), (2, 0, False)])
    first.quorum()
    writers = [(first.writer, None)]
    for _ in range(3):
        first.quorum()
        late.quorum()
        writers.append((first.writer, late.writer))
    assert writers == [(True, None), (True, False), (True, False), (False, True)]
