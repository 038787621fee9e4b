"""Data parallelism of a model across workers: FSDP2 wrapping, DDP, and model/optimizer state by parameter name
(torch.distributed.checkpoint's state-dict API).

May import: errors, spec
"""
