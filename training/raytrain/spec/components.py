"""Users' own code in a run config: a section names a callable by import path, its other keys are the callable's
keyword arguments (torchtune's `_component_`, LightningCLI's `class_path` + `init_args`, Hydra's `_target_`).

    model:
      _component_: my_models.TinyConvNet    # package.module.name or package.module:name
      channels: 8                            # checked against TinyConvNet's signature before Ray starts

This module resolves the path (the built-in components have short aliases), checks the keyword arguments against
the signature and its annotations with pydantic (the same library checks raytrain's own sections), and turns every
failure into one paragraph naming the file, the key and the fix. Nothing here imports torch: `raytrain validate`
checks the built-in components of a RayJob's run config without it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import sys
import traceback
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import pydantic

from raytrain.errors import ConfigError, shown
from raytrain.rundir import console
from raytrain.spec import workdir

COMPONENT_KEY = "_component_"
LEGACY_NAME_KEY = "name"  # configs written before components: `name: mlp` means `_component_: mlp`

# Short names for the built-in components, per section. A value without a dot is looked up here.
ALIASES: dict[str, dict[str, str]] = {
    "model": {
        "mlp": "raytrain.models.mlp",
        "small_cnn": "raytrain.models.small_cnn",
        "vit": "raytrain.models.vit",
        "text_rnn": "raytrain.models.text_rnn",
        "gpt": "raytrain.models.gpt",
    },
    "data": {
        "linear": "raytrain.data.linear.Linear",
        "digits": "raytrain.data.digits.Digits",
        "mnist": "raytrain.data.mnist.MNIST",
        "cifar10": "raytrain.data.cifar10.CIFAR10",
        "text": "raytrain.data.text.Text",
        "streaming": "raytrain.data.streaming.Streaming",
        "chartext": "raytrain.data.chartext.CharText",
    },
    "loop": {"default": "raytrain.loop.train_loop"},
    "loss": {
        "cross_entropy": "torch.nn.functional.cross_entropy",
        "mse": "torch.nn.functional.mse_loss",
        "l1": "torch.nn.functional.l1_loss",
        "nll": "torch.nn.functional.nll_loss",
        "next_token_cross_entropy": "raytrain.nets.next_token_cross_entropy",
    },
}


class ComponentError(ConfigError):
    """A component reference or its arguments are wrong; str() is one paragraph (file, key, fix)."""


@dataclass(frozen=True)
class Component:
    """A resolved reference: the canonical import path, the callable, and its checked keyword arguments."""

    path: str
    target: Callable
    kwargs: dict

    def to_dict(self) -> dict:
        return {COMPONENT_KEY: self.path, **self.kwargs}


# ----------------------------------------------------------------------------------------------------------
# import paths


def canonical_path(reference: str, section: str) -> str:
    """An alias or a dotted path (module:name also accepted) as module.name."""
    reference = reference.strip()
    if reference in ALIASES.get(section, {}):
        return ALIASES[section][reference]
    return reference.replace(":", ".")


def short_name(path: str, section: str) -> str:
    """The alias of a built-in component (for summaries: "small_cnn on digits"), else the import path itself."""
    return next((alias for alias, target in ALIASES.get(section, {}).items() if target == path), path)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


def _error_site(err: BaseException) -> str:
    """`file:line` of the innermost frame of an exception raised while importing user code."""
    frames = traceback.extract_tb(err.__traceback__)
    if isinstance(err, SyntaxError) and err.filename:
        return f" ({err.filename}:{err.lineno})"
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def innermost_site(err: BaseException) -> str:
    """` (at file:line in function)` of the innermost frame outside raytrain and the libraries it runs on: where a
    user's code raised."""
    ours = Path(__file__).resolve().parents[1]  # the raytrain package
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith(str(ours)) and "site-packages" not in f.filename]
    return f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""


def import_target(reference: Any, where: Where, section: str) -> tuple[str, Callable]:
    """(canonical path, callable) for `section._component_: reference`; ComponentError saying what to fix."""
    key = f"{section}.{COMPONENT_KEY}"
    where = where_of(where, key)
    aliases = ALIASES.get(section, {})
    builtins = f" or a built-in: {', '.join(aliases)}" if aliases else ""
    if not isinstance(reference, str) or not reference.strip():
        raise ComponentError(f"{where}: {key}: {shown(reference)} is not an import path. Fix: name a callable as "
                             f"package.module.name{builtins}.")
    path = canonical_path(reference, section)
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute or not all(part.isidentifier() for part in path.split(".")):
        raise ComponentError(f"{where}: {key}: {shown(reference)} is neither an import path (package.module.name) nor a "
                             f"built-in name. Fix: {_did_you_mean(reference, aliases)}write module.name{builtins}.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ComponentError(
                f"{where}: {key}: module '{module_name}' cannot be imported: '{missing}' is not on the import path "
                f"(the working directory {_working_dirs()} and the installed packages). Fix: run raytrain from your "
                f"project's directory or pass --working-dir DIR, or install your package (in the image for a "
                f"cluster); check the spelling of {shown(reference)}.") from None
        raise ComponentError(f"{where}: {key}: importing '{module_name}' failed: {err}{_error_site(err)}. Fix: "
                             f"install '{missing}' where the run executes (and in the image for a cluster).") from None
    except Exception as err:  # the user's module raised while importing: show where
        raise ComponentError(f"{where}: {key}: importing '{module_name}' failed: {err.__class__.__name__}: {err}"
                             f"{_error_site(err)}. Fix: the error is in your module's import-time code.") from None
    if not hasattr(module, attribute):
        public = [name for name, value in vars(module).items()  # its own callables, not what it imported
                  if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == module.__name__]
        raise ComponentError(f"{where}: {key}: module '{module_name}' has no '{attribute}'. Fix: "
                             f"{_did_you_mean(attribute, public)}name one of its callables "
                             f"({', '.join(public[:12])}{', ...' if len(public) > 12 else ''}).")
    target = getattr(module, attribute)
    if not callable(target):
        raise ComponentError(f"{where}: {key}: '{path}' is {_a(type(target).__name__)}, not a callable. Fix: name a "
                             f"class or function.")
    return path, target


def _working_dirs() -> str:

    return str(workdir.current() or "(none)")


# ----------------------------------------------------------------------------------------------------------
# keyword arguments against the signature


def signature_model(target: Callable, skip: int = 0, injected: tuple[type, ...] = ()) -> type[pydantic.BaseModel]:
    """A pydantic model of `target`'s keyword arguments: annotations (Annotated constraints included) and defaults.
    The first `skip` positional parameters and parameters annotated with an `injected` type are raytrain's to pass.
    Unannotated parameters take any value; **kwargs allows unknown keys."""
    return _signature_model(target, skip, injected)


@functools.lru_cache(maxsize=256)
def _signature_model(target: Callable, skip: int, injected: tuple[type, ...]) -> type[pydantic.BaseModel]:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have no signature: accept anything
        return pydantic.create_model(f"{_name(target)}Args", __config__=pydantic.ConfigDict(extra="allow"))
    hints = parameter_hints(target)
    fields: dict[str, Any] = {}
    extra = "forbid"
    positional = 0
    for name, param in signature.parameters.items():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) and positional < skip:
            positional += 1
            continue
        if param.kind == param.VAR_KEYWORD:
            extra = "allow"
            continue
        if param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
            continue
        hint = hints.get(name, Any if param.annotation is param.empty else param.annotation)
        if isinstance(hint, str):  # a forward reference that did not evaluate (said by parameter_hints)
            hint = Any
        if injected and _is_injected(hint, injected):
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hint, default)
    config = pydantic.ConfigDict(extra=extra, arbitrary_types_allowed=True, protected_namespaces=())
    try:
        return pydantic.create_model(f"{_name(target)}Args", __config__=config, **fields)
    except pydantic.PydanticUserError:  # an annotation pydantic cannot check: only that one is taken as Any
        for name, (hint, default) in list(fields.items()):
            try:
                pydantic.create_model("Probe", __config__=config, **{name: (hint, default)})
            except pydantic.PydanticUserError as err:
                _say_unchecked(target, name, hint, f"pydantic cannot check it: {str(err).splitlines()[0]}")
                fields[name] = (Any, default)
        return pydantic.create_model(f"{_name(target)}Args", __config__=config, **fields)


_UNCHECKED_SAID: set[tuple[str, str]] = set()


def _say_unchecked(target: Callable, name: str, annotation: Any, why: str) -> None:
    """A parameter whose annotation cannot be used is taken as Any, and said once: a check is never dropped unsaid."""
    where = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', _name(target))}"
    if (where, name) in _UNCHECKED_SAID:
        return
    _UNCHECKED_SAID.add((where, name))

    console.warning(f"{where}: the value of parameter '{name}' is not checked: its annotation {annotation!r} {why}. "
                    f"Fix: import the annotation's names at run time (not only under TYPE_CHECKING), or leave it "
                    f"unannotated.")


def parameter_hints(target: Callable) -> dict[str, Any]:
    """The evaluated annotations of target's parameters (a dataclass's fields, a class's __init__), Annotated
    constraints kept. An annotation that does not evaluate here is left out (taken as Any) without losing the
    others: the built-in models are torch-free and annotate their return as the TYPE_CHECKING-only "nn.Module",
    which must not switch off the checks of their arguments."""
    owner = target if dataclasses.is_dataclass(target) else target.__init__ if inspect.isclass(target) else target
    try:
        hints = typing.get_type_hints(owner, include_extras=True)
    except (NameError, AttributeError, SyntaxError, TypeError):  # one annotation does not evaluate: the others still do
        hints = {}
        for klass_or_function in reversed(owner.__mro__) if inspect.isclass(owner) else [owner]:
            module = sys.modules.get(getattr(klass_or_function, "__module__", ""))
            namespace = dict(getattr(inspect.unwrap(klass_or_function), "__globals__", None) or vars(module or sys))
            for name, annotation in inspect.get_annotations(klass_or_function).items():
                if name == "return":  # never checked; the built-in models' "nn.Module" is for type checkers only
                    continue
                try:
                    hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307
                except (NameError, AttributeError, SyntaxError, TypeError) as err:  # e.g. a TYPE_CHECKING-only name
                    _say_unchecked(klass_or_function, name, annotation,
                                   f"does not evaluate here ({err.__class__.__name__}: {err})")
    hints.pop("return", None)
    return hints


def _is_injected(hint: Any, injected: tuple[type, ...]) -> bool:
    return isinstance(hint, type) and issubclass(hint, injected)


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _name(target: Callable) -> str:
    return "".join(ch for ch in getattr(target, "__name__", "Component") if ch.isalnum()) or "Component"


Where = typing.Union[str, Callable[[str], str]]  # a file name, or one per dotted key (a --set names its own)


def check_kwargs(target: Callable, kwargs: dict, where: Where, section: str, skip: int = 0,
                 injected: tuple[type, ...] = (), path: Optional[str] = None) -> dict:
    """The keyword arguments as the callable will get them (YAML's '1e-3' becomes 0.001), defaults included where
    they are plain data (so config.yaml shows what trained), or ComponentError naming the first wrong key."""
    model = signature_model(target, skip, injected)
    _refuse_bools(model, kwargs, where, section, path or _name(target))
    try:
        checked = model.model_validate(kwargs)
    except pydantic.ValidationError as err:
        raise ComponentError(explain(err, model, kwargs, where, section, path or _name(target))) from None
    values = {name: getattr(checked, name) for name in model.model_fields
              if name in kwargs or _plain(getattr(checked, name))}
    values.update({k: v for k, v in (checked.model_extra or {}).items()})
    return values


def _refuse_bools(model: type[pydantic.BaseModel], kwargs: dict, where: Where, section: str, what: str) -> None:
    """true/false where a number is meant: pydantic would read it as 1/0 (`model.width: true` builds a width-1 model),
    so a boolean is taken only by a parameter whose annotation names bool (or takes anything)."""
    for name, value in kwargs.items():
        field = model.model_fields.get(name)
        if isinstance(value, bool) and field is not None and not _admits_bool(field.annotation):
            key = f"{section}.{name}" if section else name
            expected = _annotation_text(field.annotation)
            bound = next((_bound_text({k: getattr(m, k)}) for m in field.metadata for k in ("gt", "ge", "lt", "le")
                          if getattr(m, k, None) is not None), "")
            raise ComponentError(f"{where_of(where, key)}: {key}: {str(value).lower()} is not allowed ({what} takes "
                                 f"{expected} here, and a boolean is not one). Fix: use {expected}{bound}.")


def _admits_bool(hint: Any) -> bool:
    if hint is Any or hint is bool or hint is object:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _admits_bool(typing.get_args(hint)[0])
    if origin is typing.Literal:
        return any(isinstance(choice, bool) for choice in typing.get_args(hint))
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        return any(_admits_bool(option) for option in typing.get_args(hint))
    return origin is None and not (isinstance(hint, type) and issubclass(hint, (int, float, str, bytes, list, dict,
                                                                                  tuple, set)))


def _plain(value: Any) -> bool:
    """YAML-safe data: what a resolved config can store and read back."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def where_of(where: Where, key: str) -> str:
    return where(key) if callable(where) else where


def explain(err: pydantic.ValidationError, model: type[pydantic.BaseModel], given: dict, where: Where, section: str,
            what: str) -> str:
    """One paragraph for the first error pydantic found."""
    first = err.errors()[0]
    # pydantic names the member of a union it tried ("literal['adam','adamw','sgd']", "function-after[...]",
    # "list[str]"): a type, not a key of the user's config
    loc = [str(part) for part in first.get("loc", ()) if not (isinstance(part, str) and "[" in part)]
    name = loc[0] if loc else "?"
    key = ".".join([section, *loc]) if section else ".".join(loc)
    where = where_of(where, ".".join([section, name]))
    known = list(model.model_fields)
    kind = first.get("type", "")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        accepted = ", ".join(known) or "none"
        return (f"{where}: unknown key '{key}': {what} takes no argument '{name}'. Fix: "
                f"{_did_you_mean(name, known)}its keyword arguments are: {accepted}.")
    if kind == "missing":
        return (f"{where}: {key} is required: {what} has no default for '{name}'. Fix: set {key} in the "
                f"'{section}' section (or with --set {key}=...).")
    value = given.get(name, first.get("input"))
    if kind == "value_error":  # a validator of ours: its message is the fix
        return f"{where}: {key}: {shown(value)} is not allowed. Fix: use {first.get('msg', '').removeprefix('Value error, ')}."
    expected = _annotation_text(model.model_fields[name].annotation) if name in model.model_fields else "a valid value"
    message = first.get("msg", "invalid").rstrip(".")
    bound = _bound_text(first.get("ctx") or {})
    return f"{where}: {key}: {shown(value)} is not allowed ({message}). Fix: use {expected}{bound}."


def _bound_text(ctx: dict) -> str:
    """The limit pydantic checked (Field(gt=0), ...), as the fix says it."""
    for name, text in (("gt", " greater than {}"), ("ge", " of {} or more"), ("lt", " less than {}"),
                       ("le", " of {} or less")):
        if name in ctx:
            return text.format(ctx[name])
    return ""


def _annotation_text(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        inner = typing.get_args(hint)[0]
        bounds = [_bound_text({k: getattr(m, k)}) for m in getattr(hint, "__metadata__", ())
                  for k in ("gt", "ge", "lt", "le") if getattr(m, k, None) is not None]
        return _annotation_text(inner) + "".join(bounds[:1])
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    if origin is typing.Union:
        return " or ".join(_annotation_text(option) for option in typing.get_args(hint))
    if origin is list and typing.get_args(hint):
        return f"a list, each item {_annotation_text(typing.get_args(hint)[0])}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
            type(None): "null"}.get(hint, getattr(hint, "__name__", str(hint)).replace("typing.", ""))


# ----------------------------------------------------------------------------------------------------------
# a section that names a component


def split_section(raw: dict, where: Where, section: str, default: Optional[str] = None) -> tuple[str, dict]:
    """(reference, the other keys) of a component section; `name:` is read as `_component_:`."""
    raw = dict(raw)
    where = where_of(where, f"{section}.{COMPONENT_KEY}")
    reference = raw.pop(COMPONENT_KEY, None)
    legacy = raw.pop(LEGACY_NAME_KEY, None) if reference is None else None
    reference = reference if reference is not None else legacy
    if reference is None:
        if default is None:
            aliases = ALIASES.get(section, {})
            raise ComponentError(f"{where}: {section}.{COMPONENT_KEY} is missing. Fix: name the callable that builds "
                                 f"it, e.g. {COMPONENT_KEY}: my_project.MyThing, or a built-in: {', '.join(aliases)}.")
        reference = default
    return reference, raw


def resolve(raw: dict, where: Where, section: str, *, default: Optional[str] = None, skip: int = 0,
            injected: tuple[type, ...] = (), reserved: tuple[str, ...] = ()) -> tuple[Component, dict]:
    """Resolve a component section: (Component, the reserved keys raytrain itself reads from the section)."""
    reference, rest = split_section(raw, where, section, default)
    own = {key: rest.pop(key) for key in reserved if key in rest}
    path, target = import_target(reference, where, section)
    kwargs = check_kwargs(target, rest, where, section, skip=skip, injected=injected, path=path)
    return Component(path, target, kwargs), own


def instantiate(component: Component, *args: Any, **injected: Any) -> Any:
    """Call the component with raytrain's positional arguments, its checked kwargs, and each injected value whose
    type a parameter's annotation names (e.g. `ctx: raytrain.data.DataContext`)."""
    kwargs = dict(component.kwargs)
    if injected:
        target = component.target
        try:
            parameters = inspect.signature(target).parameters
            hints = parameter_hints(target)
        except (TypeError, ValueError):  # a builtin without a signature: nothing to inject
            parameters, hints = {}, {}
        for name in parameters:
            hint = hints.get(name)
            if name in kwargs or not isinstance(hint, type):
                continue
            for value in injected.values():
                if isinstance(value, hint):
                    kwargs[name] = value
    return component.target(*args, **kwargs)


def module_file(path: str) -> Optional[Path]:
    """The file a component's module was loaded from (None for built-in or namespace modules)."""
    module = sys.modules.get(path.rpartition(".")[0])
    filename = getattr(module, "__file__", None)
    return Path(filename).resolve() if filename else None
