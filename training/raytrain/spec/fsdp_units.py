"""What `scaling.fsdp_wrap` may name, known without torch: the module classes each built-in model
(raytrain.models) is built of, and the one rule and message for a name the model lacks. The config applies it at
load to a built-in model, so that `raytrain validate` refuses what `raytrain run` refuses; the preflight applies it to
any model once built (parallel/sharding.py check_units)."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Optional

_NN = "torch.nn.modules."
_LINEAR, _DROPOUT = f"{_NN}linear.Linear", f"{_NN}dropout.Dropout"
_VISION = "torchvision.models.vision_transformer."


def built_of(path: str, target: Callable, kwargs: dict) -> Optional[tuple[str, list[str]]]:
    """(the root module's class name, the classes of its other modules as module.qualname) that the built-in model
    `path` (its function `target`, called with `kwargs` and its defaults) is built of, as torch builds it; None for
    any other model. tests/test_models.py builds each on the meta device and compares."""
    if not path.startswith("raytrain.models."):
        return None
    try:
        args: dict[str, Any] = {name: p.default for name, p in inspect.signature(target).parameters.items()}
    except (TypeError, ValueError):
        return None
    args.update(kwargs)
    name = path.rpartition(".")[2]
    if name == "mlp":
        return "Sequential", [_LINEAR] + ([f"{_NN}activation.ReLU"] if args.get("layers", 1) > 0 else [])
    if name == "small_cnn":
        return "Sequential", [f"{_NN}activation.ReLU", f"{_NN}batchnorm.BatchNorm2d", f"{_NN}conv.Conv2d", _DROPOUT,
                              f"{_NN}flatten.Flatten", _LINEAR, f"{_NN}pooling.AdaptiveAvgPool2d",
                              f"{_NN}pooling.MaxPool2d"]
    if name == "text_rnn":
        return "TextRNN", [_DROPOUT, _LINEAR, f"{_NN}rnn.{str(args.get('cell', 'lstm')).upper()}",
                           f"{_NN}sparse.Embedding"]
    if name == "gpt":
        return "GPT", ["raytrain.nets.TransformerBlock", f"{_NN}activation.GELU", f"{_NN}container.ModuleList",
                       f"{_NN}container.Sequential", _DROPOUT, _LINEAR, f"{_NN}normalization.LayerNorm",
                       f"{_NN}sparse.Embedding"]
    if name == "vit":
        return "VisionTransformer", [f"{_NN}activation.GELU", f"{_NN}activation.MultiheadAttention",
                                     f"{_NN}container.Sequential", f"{_NN}conv.Conv2d", _DROPOUT, _LINEAR,
                                     f"{_NN}linear.NonDynamicallyQuantizableLinear", f"{_NN}normalization.LayerNorm",
                                     f"{_VISION}Encoder", f"{_VISION}EncoderBlock", f"{_VISION}MLPBlock"]
    return None


def fsdp_wrap_problem(names: list[str], classes: list[str], model: str) -> Optional[tuple[str, str]]:
    """(what is wrong, the fix) where scaling.fsdp_wrap names a class (by its name or module.qualname) that the model
    `model`, built of `classes` (module.qualname), lacks; None where it has them all."""
    missing = [n for n in names if not any(n in (c.rpartition(".")[2], c) for c in classes)]
    if not missing:
        return None
    present = sorted({c.rpartition(".")[2] for c in classes})
    close = difflib.get_close_matches(missing[0], present, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return (f"{', '.join(missing)} is not a module class of the model {model}",
            f"{hint}name classes the model has: {', '.join(present) or '(none)'}")
