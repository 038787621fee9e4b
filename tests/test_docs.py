"""The documentation site (mkdocs.yml, docs/) and README.md stay true to the code: the generated reference pages
are what scripts/docs-reference writes now, the site builds in strict mode (no broken link or anchor, no page
left out of the navigation), and every `raytrain ...` command they show parses with the real parser, names a
preset or file that exists, and sets keys the config loader accepts."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def docs_reference():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------- generated reference

def test_the_committed_reference_pages_are_what_the_code_generates():
    stale = [str(path) for path, text in docs_reference().render().items()
             if not (REPO / path).exists() or (REPO / path).read_text() != text]
    assert not stale, f"{stale} differ from the code: run scripts/docs-reference and commit the result"


def test_the_script_rewrites_a_stale_page_and_check_names_it(tmp_path, monkeypatch, capsys):
    module = docs_reference()
    chart = tmp_path / "helm" / "raytrain-cluster"
    chart.mkdir(parents=True)
    shutil.copy(REPO / "helm" / "raytrain-cluster" / "values.yaml", chart)
    shutil.copytree(REPO / "docs" / "reference", tmp_path / "docs" / "reference")
    monkeypatch.setattr(module, "REPO", tmp_path)
    assert module.main(["--check"]) == 0
    stale = tmp_path / "docs" / "reference" / "config.md"
    stale.write_text(stale.read_text().replace("passes over the training set", "passes over the data"))
    assert module.main(["--check"]) == 1
    assert "docs/reference/config.md differ from the code: run scripts/docs-reference" in capsys.readouterr().err
    assert module.main([]) == 0 and module.main(["--check"]) == 0  # rewritten
    assert module.main(["--frobnicate"]) == 2


def test_the_script_has_a_usage_line_and_passes_shellcheck():
    from tests.support.tools import require_tool

    usage = subprocess.run(["scripts/docs-reference", "--help"], cwd=REPO, capture_output=True, text=True)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: scripts/docs-reference [--check]")
    lint = subprocess.run([require_tool("shellcheck"), "scripts/docs-reference"], cwd=REPO, capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_every_run_config_key_and_cli_argument_has_a_meaning():
    for path, text in docs_reference().render().items():
        empty = []
        for row in text.splitlines():
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
            if row.startswith("| `") and cells:
                meaning = cells[1] if path.name == "cli.md" else cells[-1]
                empty += [cells[0]] if not meaning else []
        assert not empty, f"{path}: no meaning for {empty}: give it a help text or a comment in the code"


def test_a_chart_value_holding_dots_or_a_list_index_is_looked_up():
    lookup = docs_reference()._lookup
    values = {"labels": {"app.kubernetes.io/name": "x"}, "tolerations": [{"key": "gpu"}]}
    assert lookup(values, "labels.app.kubernetes.io/name") == "x"
    assert lookup(values, "tolerations[0].key") == "gpu"
    with pytest.raises(KeyError):
        lookup(values, "labels.missing")


# ----------------------------------------------------------------------------------------------- the site

def test_the_site_builds_in_strict_mode(tmp_path):
    # mkdocs (a dev extra) in this interpreter; --strict turns every warning (a broken link or anchor, a page
    # missing from the navigation) into a failure.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, not about the site
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert built.returncode == 0, built.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()


# ------------------------------------------------------------------------------------ the commands shown

FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)
OPERATORS = {"&&", "||", ";", "|", "&", "--"}


def shown_commands(text: str) -> list[str]:
    """`raytrain ...` command lines in a Markdown text's shell code blocks (comments, continuations, pipes and
    `cmd1 && cmd2` handled as a shell would split them)."""
    commands = []
    for language, body in FENCE.findall(text):
        if language not in ("sh", "bash", "shell", "console", ""):
            continue
        body = re.sub(r"<<'?EOF'?\n.*?^EOF$", "", body, flags=re.M | re.S)  # heredocs are files, not commands
        for line in body.replace("\\\n", " ").splitlines():
            commands += _raytrain_in(line)
    return commands


def mentioned_commands(text: str) -> list[str]:
    """`raytrain ...` in inline code spans of the prose: often a command's name or a part of one (`raytrain run`,
    `raytrain report s3://...`), so only its command words and its options are checked (check_mention)."""
    # `a|b` without spaces is a choice of words (`suspend|unsuspend`), not a pipe: only spaced operators split.
    return [re.sub(r"^(\.venv/bin/)?raytrain ", "", part).strip()
            for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", FENCE.sub("", text))
            if re.match(r"(\.venv/bin/)?raytrain [a-z]", span)
            for part in re.split(r" (?:&&|\|\||\||;) ", span.split(" #")[0]) if part.startswith(("raytrain", ".venv"))]


def _raytrain_in(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: prose, not a command
        return []
    found, current, command_position = [], None, True
    for token in tokens:
        if current is not None and token in OPERATORS - {"--"}:
            found.append(shlex.join(current))
            current = None
        elif current is not None:
            current.append(token)
        elif command_position and token.rsplit("/", 1)[-1] == "raytrain":
            current = []
        # raytrain is the command where a command starts: first, after an operator or `--` (`ray job submit ...
        # -- raytrain run ...`), or after VAR=value assignments; elsewhere it is an argument (a release name).
        command_position = token in OPERATORS or command_position and re.match(r"^\w+=", token) is not None
    if current is not None:
        found.append(shlex.join(current))
    return [c for c in found if c]


# Placeholders the pages write in commands: they stand for a value the reader picks.
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|^[A-Z][A-Z_]*$|\|")


def check_command(command: str) -> str | None:
    """None when `raytrain COMMAND` parses with the real parser and, for a config-taking command, its CONFIG (a
    preset, or a file that exists here) loads with its --set, --name and --storage; else what is wrong."""
    from raytrain.cli import build_parser
    from raytrain.spec.config import PRESETS_DIR, load_config
    from raytrain.errors import RaytrainError
    from raytrain.spec.run_options import config_overrides

    argv = shlex.split(command)
    if any("|" in a and not a.startswith(("s3:", "gs:")) for a in argv):  # `suspend|unsuspend`: alternatives
        alternatives = [a for a in argv if "|" in a]
        return None if all(check_command(command.replace(a, choice)) is None
                           for a in alternatives for choice in a.split("|")) else f"{command}: an alternative fails"
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return None if exit_.code == 0 else errors.getvalue().strip().splitlines()[-1]
    config = getattr(args, "config", None)
    if config is None or args.command == "cluster":
        return None
    if config.endswith((".yaml", ".yml")) and not (REPO / config).exists():
        return None  # the reader's own file (my-job.yaml): only its options are checked
    if not config.endswith((".yaml", ".yml")) and not (PRESETS_DIR / f"{config}.yaml").exists():
        return f"{command}: no preset named {config!r}"
    plain = lambda value: None if value is None or PLACEHOLDER.search(value) else value  # noqa: E731
    sets = [s for s in args.set or [] if not PLACEHOLDER.search(s.partition("=")[2])]
    try:
        load_config(str(REPO / config) if config.endswith((".yaml", ".yml")) else config,
                    config_overrides(sets, plain(args.name), plain(args.storage)), smoke=args.smoke_test,
                    import_user_code=False)
    except RaytrainError as err:
        return f"{command}: {err}"
    return None


def check_mention(command: str) -> str | None:
    """None when the command words of a `raytrain ...` mention name a command and each --option it gives is one
    of that command's; else what is wrong."""
    from raytrain.cli import build_parser

    parser = build_parser()
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for index, word in enumerate(words):
        subcommands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if subcommands is None or word.startswith("-"):
            break
        for alternative in re.split(r"[|/]", word):  # `raytrain cluster suspend|unsuspend`, `head/join`
            if alternative not in subcommands:
                return f"raytrain {command}: no command {' '.join(words[:index] + [alternative])!r}"
        parser = subcommands[re.split(r"[|/]", word)[0]]
    options = {option for action in parser._actions for option in action.option_strings}
    unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in options]
    return f"raytrain {command}: {parser.prog} has no option {unknown}" if unknown else None


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_raytrain_command_shown_exists_with_its_flags_presets_and_keys(document):
    text = document.read_text()
    wrong = [problem for problem in map(check_command, shown_commands(text)) if problem]
    wrong += [problem for problem in map(check_mention, mentioned_commands(text)) if problem]
    assert not wrong, f"{document.relative_to(REPO)} shows commands raytrain refuses:\n" + "\n".join(wrong)


def test_the_command_check_finds_each_kind_of_mistake():
    text = ("```sh\nraytrain run linear --set train.epochs=3   # fine\n"
            "raytrain frobnicate x && raytrain run linear --epochs 3\n"
            "raytrain run no-such-preset\nraytrain run digits --set train.epoch=3\n"
            "helm install raytrain helm/raytrain-cluster   # a release named raytrain: not the command\n"
            "ray job submit --address http://127.0.0.1:8265 -- raytrain run gpt --set model.nope=1\n```\n"
            "Inline: `raytrain run`, `raytrain cluster suspend|unsuspend`, `raytrain tune --serach x`, `raytrain frob`.\n")
    commands = shown_commands(text)
    assert commands == ["run linear --set train.epochs=3", "frobnicate x", "run linear --epochs 3",
                        "run no-such-preset", "run digits --set train.epoch=3", "run gpt --set model.nope=1"]
    problems = [check_command(c) for c in commands]
    assert problems[0] is None
    assert "invalid choice: 'frobnicate'" in problems[1]
    assert "unrecognized arguments: --epochs" in problems[2]
    assert "no preset named 'no-such-preset'" in problems[3]
    assert "train.epoch" in problems[4] and "epochs" in problems[4]  # the loader's did-you-mean
    assert "model" in problems[5] and "nope" in problems[5]
    mentions = mentioned_commands(text)
    assert mentions == ["run", "cluster suspend|unsuspend", "tune --serach x", "frob"]
    problems = [check_mention(m) for m in mentions]
    assert problems[:2] == [None, None]
    assert "no option ['--serach']" in problems[2] and "no command 'frob'" in problems[3]
