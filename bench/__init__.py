"""The benchmark: what raytrain costs against raw PyTorch, measured in one invocation (`scripts/bench`).

Not part of the installed package: it drives raytrain from outside, as a user would, and reads what a run
writes. One module per part over a small shared harness:

- harness: the settings, interleaved rounds, figure rows (one JSON line each), results.json
- report: results.md and the chart (bench.png)
- workload: the CPU workload both sides run (CIFAR-shaped data, the timed loop) and where the sides run
- throughput: p1 (training samples/s, Ray Train / raw torch) and p2 (ingest batches/s, time waiting for data)
- core: p1core, `raytrain run PRESET` (the product's own loop, data and model) against a plain PyTorch loop on
  the preset's model and training split (digits, and a compute-bound ViT)
- ckptread: the bytes read from a checkpoint between its write and the next start's first step (strace)
- cluster: a local multi-node cluster shaped like the chart's, jobs submitted as KubeRay's submitter does,
  and when a run reached its first optimizer step
- first_step: p3, submission to the first optimizer step (running cluster and cold)
- recovery: p4, a worker node killed (SIGKILL) or its pod deleted (preStop drain, SIGTERM) to the next optimizer
  step, and the completed steps trained again, both side by side
- sharded: p5, the sharded checkpointer's blocking time (synchronous against asynchronous saves) and each
  worker's peak memory with FSDP2 against DDP, on the gpt preset's model in 2 gloo processes (no Ray)
- scaling: 1 against 2 Ray Train workers on two worker nodes
- gpu: ViT with bf16, Ray Train against raw torch, and MFU
- probes: a model wrapper that records rank 0's first forward passes, or every one (runs inside a training job)
- cli: the command line (`python -m bench`) and the run of the selected parts

Sides are interleaved round by round (alternating which goes first) so that machine noise hits both alike; each
figure reports the median, min and max over the rounds. Nothing here asserts a speed: it prints what it measured.
"""
