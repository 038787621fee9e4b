"""Byte-level text for the GPT preset: any file read as bytes (vocabulary 256, so no tokenizer and no vocabulary
file; UTF-8 text, or any binary), cut into windows of `block_size` bytes whose targets are the same bytes shifted
by one. Offline, `path: ""` generates a corpus of sentences from a small grammar, seeded by train.seed, which a
model learns quickly (its loss falls well below ln 256 within a few hundred steps).

The last `val_fraction` of the bytes are held out for validation (a contiguous tail, so no window straddles the
two splits).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field

from raytrain.data import DataContext, DataSource, DataUnavailable, check_generated_size, splits

VOCAB_SIZE = 256  # one token per byte value


@dataclass
class CharText(DataSource):
    path: str = ""  # a file read as bytes; relative to the data root (<storage_path>/datasets); "" = generated
    block_size: Annotated[int, Field(gt=0)] = 128  # bytes per sample (the model's block_size must be >= this)
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1  # the file's tail held out for validation
    generated_bytes: Annotated[int, Field(gt=0)] = 2_000_000  # path "" only: the generated corpus's size

    default_loss: ClassVar[str] = "next_token_cross_entropy"  # logits [B, T, 256] against targets [B, T]

    def prepare(self, ctx: DataContext) -> None:
        if self.path:
            read_file(self, ctx)  # a missing or too short file fails in the driver, before any worker starts

    def datasets(self, ctx: DataContext) -> dict:
        corpus = read_file(self, ctx) if self.path else generate(self.generated_bytes, ctx.seed)
        train, val = split(corpus, self.val_fraction, self.block_size)
        return splits(Windows(train, self.block_size), Windows(val, self.block_size))

    def check(self, cfg, fail) -> None:
        check(self, cfg, fail)


class Windows:
    """Map-style (x, y) pairs over a byte array: non-overlapping windows of `block_size` bytes as int64 tokens, y
    shifted one byte ahead of x. Tensors are made per item, so a file's bytes are held once (memory-mapped)."""

    def __init__(self, data: np.ndarray, block_size: int):
        self.data, self.block_size = data, block_size

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, index: int):
        import torch

        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.block_size
        chunk = torch.from_numpy(self.data[start:start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def file_path(p: CharText, ctx: DataContext) -> Path:
    # Relative to the data root, not to the working directory: the workers' working directory is not the driver's.
    path = Path(p.path).expanduser()
    return path if path.is_absolute() else ctx.root / path


def min_bytes(block_size: int) -> int:
    return 2 * (block_size + 1)  # one window to train on and one to validate


def read_file(p: CharText, ctx: DataContext) -> np.ndarray:
    """The file's bytes, memory-mapped; DataUnavailable naming the path and the fix if it cannot serve."""
    path = file_path(p, ctx)
    where = f"data.path {p.path!r}" + ("" if str(path) == p.path else f" ({path})")
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError:
        size = None
    if size is None:
        raise DataUnavailable(f"{where} is not a file. Fix: point data.path at a text file (an absolute path, or one "
                              f"relative to {ctx.root}), or set data.path to \"\" for a generated corpus.")
    if size < min_bytes(p.block_size):
        raise DataUnavailable(f"{where} holds {size} bytes, fewer than the {min_bytes(p.block_size)} that two windows "
                              f"of data.block_size {p.block_size} need (one to train on, one to validate). Fix: give "
                              f"a longer file, or a smaller data.block_size.")
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as err:
        raise DataUnavailable(f"{where} cannot be read ({err.strerror}). Fix: make it readable by the workers "
                              f"(on a cluster: on the shared volume).") from None


def split(corpus: np.ndarray, val_fraction: float, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): val is the tail, at least one window long, and train keeps at least one window."""
    window = block_size + 1
    val_bytes = min(max(int(len(corpus) * val_fraction), window), len(corpus) - window)
    return corpus[: len(corpus) - val_bytes], corpus[len(corpus) - val_bytes:]


# ----------------------------------------------------------------------------------------------------------
# the generated corpus

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "the farmer",
            "our neighbour", "the captain", "a young girl", "the baker", "his brother"]
VERBS = ["sees", "likes", "follows", "paints", "finds", "carries", "watches", "remembers", "calls", "feeds"]
OBJECTS = ["a red ball", "the green door", "an apple", "the letter", "a wooden boat", "the little house",
           "a blue kite", "the map", "some bread", "the lamp"]
PLACES = ["in the garden", "near the river", "at the market", "on the hill", "by the old bridge",
          "under the tree", "in the kitchen", "at school"]
TIMES = ["today", "every morning", "at night", "in the spring", "after lunch", "on sunday"]


def generate(size: int, seed: int) -> np.ndarray:
    """`size` bytes of sentences "Subject verb object place time." from the word lists above, the same for a
    seed on every worker (each builds its own copy: 2 MB in well under a second)."""
    rng = np.random.default_rng(seed)
    sentences = max(size // 30, 1)  # a sentence is 40-70 bytes: enough to fill `size`
    picks = [rng.integers(len(words), size=sentences) for words in (SUBJECTS, VERBS, OBJECTS, PLACES, TIMES)]
    breaks = np.where(rng.integers(6, size=sentences) == 0, "\n", " ")  # a line ends every sixth sentence or so
    text = "".join(f"{SUBJECTS[s].capitalize()} {VERBS[v]} {OBJECTS[o]} {PLACES[p]} {TIMES[t]}.{end}"
                   for s, v, o, p, t, end in zip(*picks, breaks))
    return np.frombuffer(text.encode("ascii")[:size], dtype=np.uint8)


# ----------------------------------------------------------------------------------------------------------
# checks before Ray starts


def check(p: CharText, cfg, fail) -> None:
    if not p.path and p.generated_bytes < min_bytes(p.block_size):
        fail("data.generated_bytes", f"{p.generated_bytes} bytes make fewer than two windows of data.block_size "
             f"{p.block_size}", f"generate at least {min_bytes(p.block_size)} bytes (e.g. 2000000)")
    if not p.path:  # built as text, encoded, then an array: a few bytes of memory per byte generated
        check_generated_size(fail, "data.generated_bytes", p.generated_bytes, 4, "generated bytes")
    model = cfg.model_kwargs
    if model.get("vocab_size", VOCAB_SIZE) < VOCAB_SIZE:
        fail("model.vocab_size", f"{model['vocab_size']} cannot hold the data's {VOCAB_SIZE} tokens (one per byte "
             f"value)", f"set model.vocab_size to {VOCAB_SIZE}")
    if model.get("block_size", p.block_size) < p.block_size:
        fail("model.block_size", f"{model['block_size']} is shorter than the data's windows (data.block_size "
             f"{p.block_size})", f"set model.block_size to at least {p.block_size}, or data.block_size to at most "
             f"{model['block_size']}")
