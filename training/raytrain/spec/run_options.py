"""The options every config-taking command (`raytrain run`, `local`, `tune`) accepts, and how they become config
overrides. One copy: the CLI declares its commands with it, and `raytrain validate` reads a RayJob's
`raytrain run ...` entrypoint with the same declarations."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional, Union

from raytrain.errors import ConfigError, shorten


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="a run-config YAML file or a preset name (raytrain presets)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, e.g. train.lr=0.01")
    parser.add_argument("--name", help="run name: the directory under the storage path (same name = resume)")
    parser.add_argument("--storage", metavar="PATH", help="storage path for runs (on a cluster: the shared volume)")
    parser.add_argument("--smoke-test", action="store_true", help="apply the config's smoke block: a seconds-long run")
    parser.add_argument("--working-dir", metavar="DIR", help="your project's directory, where the config's _component_ "
                                                             "modules are imported from (default: the current "
                                                             "directory)")


def add_address_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="Ray cluster to join, e.g. auto on a head pod (default: $RAY_ADDRESS, "
                                          "else start an embedded local Ray)")


def add_lease_option(parser: argparse.ArgumentParser) -> None:
    """`raytrain run` and `local`: what a start does when another attempt of the run holds it (raytrain.rundir.lease)."""
    parser.add_argument("--wait-for-lease", action="store_true",
                        help="if another running attempt of this run holds it (it keeps renewing its lease), wait for "
                             "it to end instead of exiting; one that has died is taken over after the lease TTL "
                             "without this flag")


@dataclass(frozen=True)
class Setting:
    """An option that stands for one key (--name for run.name): its value is the string typed, never read as YAML
    (`--name 2024` is the run '2024', `--name null` the run 'null')."""

    key: str
    value: str
    origin: str


Override = Union[str, Setting]  # KEY=VALUE from --set (its value read as YAML), or an option's Setting


def config_overrides(sets: Optional[list[str]], name: Optional[str], storage: Optional[str]) -> list[Override]:
    """--set KEY=VALUE..., then --name and --storage as the run.name and run.storage_path they stand for (an error
    in those names the option the user typed)."""
    overrides: list[Override] = list(sets or [])
    for option, value, fix in (("--name", name, "give the run's name (the same name resumes it)"),
                               ("--storage", storage, "give a directory, on a cluster the shared volume such as "
                                                      "/mnt/shared/runs")):
        if value is not None and not value.strip():  # e.g. an unset shell variable: refused, never ignored
            raise ConfigError(f"{option} {value!r}: is empty. Fix: {fix}, or leave {option} out.")
    if name is not None:
        overrides.append(Setting("run.name", name, f"--name {name}"))
    if storage is not None:
        overrides.append(Setting("run.storage_path", storage, f"--storage {storage}"))
    return overrides


def override_origin(override: Override) -> str:
    """The option an override came from, as messages name it (a 5000-digit value is named, not printed)."""
    return override.origin if isinstance(override, Setting) else f"--set {shorten(override)}"
