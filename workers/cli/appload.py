"""Finding the Relay object a command works on: `--app module:attr` or RELAY_APP."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from agent_core.text import a_or_an
from workers.errors import AppNotFound
from workers.relay import Relay

__all__ = ["AppNotFound", "load_relay"]


def load_relay(spec: str | None) -> Relay:
    """Import `module:attr` and return the Relay it names.

    The current directory is importable, as with `celery -A`. The attribute may
    be omitted when the module has exactly one Relay at top level.

    Raises:
        AppNotFound: the spec is malformed, the module cannot be imported, or
            the attribute is missing or not a Relay.
    """
    if not spec or not isinstance(spec, str):
        raise AppNotFound("no app given: use --app module:attr or set RELAY_APP")
    module_name, _, attr = spec.partition(":")
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise AppNotFound(f"--app {spec!r} is not of the form module:attr")
    if attr and not all(part.isidentifier() for part in attr.split(".")):
        raise AppNotFound(f"--app {spec!r}: {attr!r} is not an attribute name")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise AppNotFound(f"--app {spec!r}: cannot import {module_name!r}: {error}") from None
    value = _attribute(module, attr, spec)
    if not isinstance(value, Relay):
        raise AppNotFound(f"--app {spec!r} is {a_or_an(type(value).__name__)}, not a workers.Relay")
    return value


def _attribute(module: object, attr: str, spec: str) -> object:
    """Return `module.attr`, or the module's only Relay when `attr` is empty."""
    name = getattr(module, "__name__", "")
    if not attr:
        found = [v for v in vars(module).values() if isinstance(v, Relay)]
        if len(found) != 1:
            raise AppNotFound(f"--app {spec!r}: name the Relay object, as in {name}:relay")
        return found[0]
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise AppNotFound(f"--app {spec!r}: {name} has no attribute {attr!r}")
        value = getattr(value, part)
    return value
