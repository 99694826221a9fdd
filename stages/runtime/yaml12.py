"""params.yaml and dvc.lock read as DVC reads them (ruamel's YAML 1.2), with PyYAML; no torch here,
so the sweep's planning and `pbr --help` stay light."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import yaml

from pbr.errors import UserError


def read_params(path: Path, error: type[UserError] = UserError) -> Any:
    """A parameters file read as `read_yaml` reads it; a file that is missing, not UTF-8 or not
    valid YAML (a key given twice included) raises `error` in one line naming it."""
    if path.is_dir():
        inside = path / "params.yaml"
        raise error(f"{path}: a folder, not a parameters file; pass "
                    f"{f'the one in it: --params {inside}' if inside.is_file() else 'a file: --params FILE'}")
    if not path.is_file():
        raise error(f"{path}: no such parameters file; run from the project root or pass --params")
    text = None
    try:
        text = path.read_text(encoding="utf-8")
        return read_yaml(text)
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except ValueError as e:  # a scalar the resolver took for a number its constructor cannot build
        raise error(f"{path}: a value cannot be read ({e}); fix or quote it") from None
    except VersionDirective as e:
        raise error(f"{path}: a %YAML {e.version} directive, which DVC reads the file by (in 1.1, 010 is 8 and yes "
                    "is true) and pbr does not (YAML 1.2 always); remove the line") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None and mark.index >= len(text.rstrip()) and getattr(e, "context_mark", None) is not None:
            # Found missing at the end of the file (a line past its last): where what is unfinished began.
            mark = e.context_mark
        where = f" at line {min(mark.line + 1, len(text.splitlines()) or 1)}" if mark else ""
        problem = (getattr(e, "problem", None) or "").strip()
        if problem.startswith("but ") and getattr(e, "context", None):  # "expected a single document ..., but found"
            problem = f"{e.context}, {problem}"
        if problem.startswith("the key"):
            raise error(f"{path}: {problem}{where}; keep one of them") from None
        if problem.startswith("the value"):
            raise error(f"{path}: {problem}{where}; fix or quote it") from None
        raise error(f"{path}: not valid YAML{where}{': ' * bool(problem)}{problem}; fix the syntax") from None


class VersionDirective(yaml.YAMLError):
    """A `%YAML 1.1` directive: ruamel (DVC) then reads the file as YAML 1.1 (`010` is 8, `yes` true),
    this loader as 1.2 whatever it says."""

    def __init__(self, version: tuple[int, int]):
        self.version = ".".join(map(str, version))
        super().__init__(f"a %YAML {self.version} directive")


def read_yaml(text: str) -> Any:
    """YAML text as this project and DVC read it (`_unique_key_loader`); raises yaml.YAMLError."""
    loader = _unique_key_loader()(text)
    try:
        data = loader.get_single_data()
        if loader.yaml_version not in (None, (1, 2)):
            raise VersionDirective(loader.yaml_version)
        return data
    finally:
        loader.dispose()


def _unique_key_loader():
    """yaml's SafeLoader, except that a key given twice in one section is an error, not the last
    value silently winning, and that scalars read as YAML 1.2 reads them: DVC reads and writes this
    file with ruamel's YAML 1.2, so `dvc exp run -S train.lr=1e-5` writes `lr: 1e-05`, a float there
    and a string to PyYAML's YAML 1.1; and 1.1's `yes`, `on`, `010` (octal 8) or `1:30` (90) are
    the strings 'yes', 'on', 10 and '1:30' in DVC's records of the run."""

    class Loader(yaml.SafeLoader):
        pass

    one_one = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in one_one]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    # The YAML 1.2 core schema's booleans, integers and floats, with what ruamel (DVC) also takes:
    # digit separators (5_120), signed and binary integers (-0x1F, 0b101).
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:int",
        # A digit after the prefix: `0x_` is no integer (ruamel's own reading of it fails in int()).
        re.compile(r"^[-+]?(?:0b_*[01][01_]*|0o_*[0-7][0-7_]*|0x_*[0-9a-fA-F][0-9a-fA-F_]*|[0-9][0-9_]*)$"),
        list("-+0123456789"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                   r"|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))

    def integer(loader, node):
        text = loader.construct_scalar(node).replace("_", "")
        sign, digits = (-1, text[1:]) if text[0] == "-" else (1, text.lstrip("+"))
        base = {"0b": 2, "0o": 8, "0x": 16}.get(digits[:2], 10)
        return sign * int(digits[2:] if base != 10 else digits, base)

    Loader.add_constructor("tag:yaml.org,2002:int", integer)

    def line_of_failure(construct):
        """A scalar the resolver took for a number or a date its constructor cannot build
        (`2026-13-45`): a YAML error at its line, not a ValueError naming neither."""
        def wrapped(loader, node):
            try:
                return construct(loader, node)
            except ValueError as e:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the value {node.value!r} cannot be read ({e})", node.start_mark) from None
        return wrapped

    for tag in ("int", "timestamp"):
        full = f"tag:yaml.org,2002:{tag}"
        Loader.add_constructor(full, line_of_failure(Loader.yaml_constructors[full]))

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                continue
            key = loader.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # yaml's own error below names it
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader
