"""The run config's keys: one flat, commented block of defaults per section (`train`, `scaling`, `run`, the
`data` section's own keys, `run.tracking`), each key's type and range in its annotation (checked with pydantic by
raytrain.spec.config), and `RunConfig`, the resolved config every room reads.

The docs' run-config reference is generated from these definitions (scripts/docs-reference).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BeforeValidator, Field

from raytrain.spec.components import COMPONENT_KEY, Component

Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]
FiniteNonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def _at_most(limit: Union[int, float], what: str, why: str) -> AfterValidator:
    """An upper bound whose refusal says the range and why (pydantic's own says only the number): every value a
    run cannot use is refused at load, before it reaches torch or Ray as an overflow or a machine's worth of
    threads."""
    def check(value: Any) -> Any:
        if value > limit:
            raise ValueError(f"{what} of at most {limit:,}: {why}")
        return value

    return AfterValidator(check)


# The upper bounds of counts (issue 40): each is far past any run's real value and short of where it breaks.
# torch.manual_seed takes a 64-bit integer, and raytrain seeds with train.seed + the epoch (+ the rank).
MAX_SEED = 2**63 - 1
MAX_EPOCHS = 10**7
MAX_BATCH = 2**31 - 1
MAX_WORKERS = 100_000
MAX_THREADS = 1024
MAX_STEPS = 2**63 - 1  # counters compared with step numbers; beyond int64 they reach no checkpoint or row anyway
Seed = Annotated[int, Field(ge=0), _at_most(
    MAX_SEED, "a seed", "torch.manual_seed takes 64-bit integers and raytrain adds the epoch and the worker's rank "
                        "to train.seed, so it accepts 0 to 2**63-1")]
Steps = Annotated[int, Field(ge=0), _at_most(MAX_STEPS, "a count", "larger numbers do not fit the 64-bit integers "
                                                                   "torch and the run's records count steps in")]


def _worker_count(value: Any) -> Union[int, list[int]]:
    """scaling.num_workers: a count, or [min, max] (an elastic run; [n, n] is the count n), each at most
    MAX_WORKERS."""
    def count(item: Any) -> bool:
        return isinstance(item, int) and not isinstance(item, bool) and item > 0

    if count(value) and value <= MAX_WORKERS:
        return value
    if (isinstance(value, (list, tuple)) and len(value) == 2 and all(map(count, value)) and value[0] <= value[1]
            and value[1] <= MAX_WORKERS):
        return value[0] if value[0] == value[1] else list(value)
    raise ValueError(f"a worker count from 1 to {MAX_WORKERS:,} (e.g. 2), or [min, max] with 1 <= min <= max <= "
                     f"{MAX_WORKERS:,} for an elastic run (e.g. [2, 4]); more workers than that is past what any Ray "
                     f"cluster runs")


WorkerCount = Annotated[Union[int, list[int]], BeforeValidator(_worker_count)]

# ----------------------------------------------------------------------------------------------------------
# defaults


@dataclass
class TrainSection:
    # passes over the training set
    epochs: Annotated[int, Field(gt=0), _at_most(MAX_EPOCHS, "a number of epochs", "more passes than any run makes "
                                                 "(a larger number is a typo, and a run of them never ends)")] = 10
    # GLOBAL batch size per optimizer step; each of N workers gets batch_size / N
    batch_size: Annotated[int, Field(gt=0), _at_most(MAX_BATCH, "a global batch size", "a step over more samples than "
                                                     "that is no batch a device or a data set holds")] = 64
    grad_accum_steps: Positive = 1  # each worker's share split into this many micro-batches per optimizer step
    # adam | adamw | sgd (built from lr, weight_decay, momentum below), or a component:
    # {_component_: torch.optim.AdamW, lr: 3e-4, betas: [0.9, 0.95]} (its own keys; lr etc. below then unused)
    optimizer: Union[Literal["adam", "adamw", "sgd"], dict] = "adamw"
    lr: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1e-3  # the named optimizer's learning rate
    weight_decay: FiniteNonNegative = 0.0  # the named optimizer's weight decay
    momentum: FiniteNonNegative = 0.9  # sgd only
    # an LR scheduler component, e.g. {_component_: torch.optim.lr_scheduler.CosineAnnealingLR, T_max: 1000,
    # interval: step}; interval: step (after every optimizer step) or epoch (default); restored on resume
    scheduler: Optional[dict] = None
    mixed_precision: Literal["auto", "off", "bf16", "fp16"] = "auto"  # auto: bf16 on GPU, off on CPU
    grad_clip: FiniteNonNegative = 0.0  # max global grad norm; 0 disables
    seed: Seed = 0  # torch's seed (each worker's: seed + rank) and every epoch's sample order derive from it
    max_steps_per_epoch: Steps = 0  # 0 = the whole epoch; smoke runs cap it
    # intra-op threads per worker; 0 = derived from the worker's CPUs
    torch_threads: Annotated[int, Field(ge=0), _at_most(MAX_THREADS, "a number of threads", "torch starts every one "
                                                        "of them per worker, and more threads than cores only "
                                                        "slows a worker down (a million take the machine down)")] = 0
    # cross_entropy (classification: val_accuracy too) | mse | l1 | nll | an import path | {_component_: ..., kwargs};
    # unset: the data source's own (mse for the regression sets), else cross_entropy. The built-in loop calls it as
    # loss(model(x), y) -> a scalar tensor (the mean over the batch); a class is built once with the kwargs, a
    # function gets them on every call after (input, target)
    loss: Optional[Union[str, dict]] = None


@dataclass
class ScalingSection:
    # Ray Train workers (DDP ranks). [min, max]: elastic, on Ray Train's own elasticity: starts with as many as fit
    # (at least min), goes on with fewer when a node goes, grows back to max when capacity returns. The global
    # batch (train.batch_size) and the learning rate stay as they are: each of N workers takes batch_size / N
    num_workers: WorkerCount = 2
    # elastic: how often Ray Train looks for room to grow the running group (Ray's elastic_resize_monitor_interval_s)
    elastic_resize_monitor_interval_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 60.0
    use_gpu: bool = False  # train on GPUs: each worker gets gpus_per_worker of them
    # auto: fit the workers into the cluster, <= 1 each
    cpus_per_worker: Union[Literal["auto"], Annotated[float, Field(gt=0, allow_inf_nan=False)]] = "auto"
    gpus_per_worker: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0  # only with use_gpu
    # ddp: every worker holds the whole model (DistributedDataParallel); fsdp: parameters, gradients and optimizer
    # state sharded over the workers (FSDP2, for models one worker cannot hold; raytrain.parallel.sharding)
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # fsdp: module classes (names or import paths) sharded as their own units; [] = the blocks in the model's
    # nn.ModuleLists (a transformer's layers), else its direct children with parameters
    fsdp_wrap: list[str] = field(default_factory=list)
    fsdp_reshard_after_forward: bool = True  # free each unit's gathered parameters after its forward (less memory)
    activation_checkpointing: bool = False  # recompute those units' activations in backward (less memory, ~1/3 slower)
    # What a lost worker costs. restart: Ray Train stops the whole group and starts a new one from the newest
    # checkpoint. torchft: each worker is a torchft replica group; the others go on at the next step without it and
    # its replacement heals from a live peer (needs a fixed num_workers, ddp and data.loader torch;
    # raytrain.worker.replicas). Checkpoints are still taken: they are what a whole job's loss resumes from.
    fault_tolerance: Literal["restart", "torchft"] = "restart"

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, list)

    @property
    def min_workers(self) -> int:
        """The fewest workers the run trains on (num_workers itself unless elastic)."""
        return self.num_workers[0] if isinstance(self.num_workers, list) else self.num_workers

    @property
    def max_workers(self) -> int:
        """The most workers the run trains on (num_workers itself unless elastic)."""
        return self.num_workers[-1] if isinstance(self.num_workers, list) else self.num_workers

    @property
    def worker_counts(self) -> range:
        """Every worker count the run may train on."""
        return range(self.min_workers, self.max_workers + 1)

    @property
    def torchft(self) -> bool:
        return self.fault_tolerance == "torchft"

    def describe_workers(self) -> str:
        return f"{self.min_workers}..{self.max_workers} (elastic)" if self.elastic else str(self.num_workers)


# run.tracking. Credentials never go in a config: MLflow reads MLFLOW_TRACKING_TOKEN (or _USERNAME/_PASSWORD) and
# W&B WANDB_API_KEY from the environment of the process that trains (a RayJob's entrypoint env: from a Secret).
@dataclass
class MlflowTracking:
    uri: Optional[str] = None  # the tracking server, e.g. http://mlflow.mlflow:5000; unset: MLFLOW_TRACKING_URI
    experiment: str = "raytrain"  # created when missing


@dataclass
class WandbTracking:
    project: str  # the W&B project the run is logged to
    entity: Optional[str] = None  # a team or user; unset: the API key's default entity
    mode: Literal["online", "offline"] = "online"  # offline: files only, uploaded later with `wandb sync`
    dir: Optional[str] = None  # where W&B writes its files; unset: W&B's own (WANDB_DIR, else the working directory)


@dataclass
class TrackingSection:
    mlflow: Optional[MlflowTracking] = None  # {uri, experiment}: one MLflow run per raytrain run
    wandb: Optional[WandbTracking] = None  # {project, entity, mode, dir}: one W&B run per raytrain run
    sync_every_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 5.0  # how often points are sent

    def trackers(self) -> list[str]:
        return [name for name in TRACKERS if getattr(self, name) is not None]


TRACKERS = ("mlflow", "wandb")
TRACKER_CLASSES = {"mlflow": MlflowTracking, "wandb": WandbTracking}
# Keys that would put a secret into config.yaml and every checkpoint: refused, naming the variable to use instead.
CREDENTIAL_KEYS = ("token", "password", "username", "api_key", "key", "secret")
CREDENTIAL_VARIABLES = {"mlflow": "MLFLOW_TRACKING_TOKEN (or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)",
                        "wandb": "WANDB_API_KEY"}


@dataclass
class RunSection:
    name: Optional[str] = None  # run directory under storage_path; default: the config's name
    storage_path: str = "./runs"  # on a cluster: the shared volume, e.g. /mnt/shared/runs
    checkpoint_every: Positive = 1  # epochs between checkpoints (the last epoch always checkpoints)
    # Mid-epoch checkpoints as well (0 = off), taken where the loop asks session.batches("train") for its next batch:
    checkpoint_every_steps: Steps = 0  # every N optimizer steps
    checkpoint_every_s: FiniteNonNegative = 0.0  # every N seconds of training
    keep_checkpoints: Positive = 2  # newest N kept; >= 2 lets a corrupt newest fall back to the one before
    # file: rank 0 writes the whole state into one state.pt; sharded: every worker writes its shards
    # (torch.distributed.checkpoint), resumable on another worker count; auto: sharded with scaling.strategy fsdp
    checkpointer: Literal["auto", "file", "sharded"] = "auto"
    async_checkpoint: bool = True  # sharded: training goes on while a checkpoint is written (at most one in flight)
    log_every_steps: Steps = 0  # a row in steps.jsonl every N optimizer steps (rank 0's loss); 0 = off
    max_failures: Annotated[int, Field(ge=-1)] = 3  # worker-group restarts before the run fails; -1 = unlimited
    # Experiment trackers fed from the driver (raytrain.driver.tracking): {mlflow: {...}} and/or {wandb: {...}}, above
    tracking: Optional[TrackingSection] = None


DEFAULT_LOOP = "raytrain.loop.train_loop"  # the built-in per-worker loop, itself written against raytrain.Session
CLASSIFICATION_LOSSES = {"torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss",
                         "torch.nn.CrossEntropyLoss", "torch.nn.NLLLoss", "torch.nn.modules.loss.CrossEntropyLoss",
                         "torch.nn.modules.loss.NLLLoss"}


@dataclass
class DataSection:
    component: Component
    loader: Literal["torch", "ray"]  # torch: map-style datasets + prepare_data_loader; ray: Ray Data shards; auto in the file: chosen by the data's size
    loader_reason: str = ""  # data.loader: auto: which loader it took and why (raytrain.data.choose_loader)

    @property
    def kwargs(self) -> dict:
        return self.component.kwargs

    @property
    def path(self) -> str:
        return self.component.path


SCHEDULER_INTERVALS = ("epoch", "step")


@dataclass
class RunConfig:
    model: Optional[Component]  # None: the loop builds its own (a loop that needs it says so: `requires`)
    data: Optional[DataSection]  # {_component_: returns {"train": ..., "val": ...}, loader: torch | ray (auto resolved), its kwargs}
    loss: Component
    loop: Component  # the per-worker training function; default raytrain.loop.train_loop
    train: TrainSection = field(default_factory=TrainSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    run: RunSection = field(default_factory=RunSection)
    source: str = "<defaults>"  # where the file part came from, for messages; not a setting
    # Component sections whose code cannot be imported here (raytrain validate without the user's project): their
    # keys are the user's and are checked when the run starts.
    unchecked: list[str] = field(default_factory=list)
    optimizer: Optional[Component] = None  # train.optimizer as a component (None: the named built-in)
    scheduler: Optional[Component] = None
    scheduler_interval: str = "epoch"

    def to_dict(self) -> dict:
        """The resolved config as plain data: what config.yaml and every checkpoint store."""
        train = asdict(self.train)
        train["loss"] = self.loss.path if not self.loss.kwargs else self.loss.to_dict()
        if self.optimizer is not None:
            train["optimizer"] = self.optimizer.to_dict()
        if self.scheduler is not None:
            train["scheduler"] = {**self.scheduler.to_dict(), "interval": self.scheduler_interval}
        return plain_data({
            "model": self.model.to_dict() if self.model is not None else None,
            "data": ({COMPONENT_KEY: self.data.path, "loader": self.data.loader, **self.data.kwargs}
                     if self.data is not None else None),
            "loop": self.loop.to_dict(),
            "train": train,
            "scaling": asdict(self.scaling),
            "run": asdict(self.run),
        })

    @property
    def model_kwargs(self) -> dict:
        """The model component's arguments ({} without a model section): what a data source's checks compare."""
        return self.model.kwargs if self.model is not None else {}

    def components(self) -> list[Component]:
        """Every component of the config (the code a run imports)."""
        found = [self.model, self.data.component if self.data else None, self.loop, self.loss, self.optimizer,
                 self.scheduler]
        return [c for c in found if c is not None]

    def batch_share(self, workers: int) -> int:
        """Each worker's share of the global batch per optimizer step on `workers` workers (micro-batches:
        / train.grad_accum_steps). The global batch stays train.batch_size whatever the count (elastic runs)."""
        return self.train.batch_size // workers

    @property
    def per_worker_batch_size(self) -> int:  # at the full size (scaling.max_workers)
        return self.batch_share(self.scaling.max_workers)

    @property
    def checkpointer(self) -> str:
        """The checkpointer this run writes with: file or sharded (run.checkpointer, auto resolved)."""
        if self.run.checkpointer != "auto":
            return self.run.checkpointer
        return "sharded" if self.scaling.strategy == "fsdp" else "file"

    @property
    def classification(self) -> bool:
        """Whether the loss is a classification loss: then validation reports accuracy too."""
        return self.loss.path in CLASSIFICATION_LOSSES


SECTIONS = ("model", "data", "loop", "train", "scaling", "run")
SMOKE_KEY = "smoke"  # a preset's block of dotted overrides for a seconds-long run
INCLUDE_KEY = "include"  # files layered under this one, e.g. a hyperparameters file and an environment file


def plain_data(value: Any) -> Any:
    """Tuples (a signature's defaults, e.g. betas) as lists: config.yaml and checkpoints are plain YAML and JSON."""
    if isinstance(value, dict):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    return value
