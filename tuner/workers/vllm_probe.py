"""Read a vLLM installation's speculative-decoding surface from its source, without importing it.

Importing vLLM takes seconds and torch; on a GPU worker it may touch the device. The facts the search needs
are declarations: the ``Literal`` aliases ``SpeculativeMethod`` is built from, the annotated fields of
``SpeculativeConfig`` (``vllm/config/speculative.py``), the members of ``AttentionBackendEnum``
(``vllm/v1/attention/backends/registry.py``) and the version in ``vllm/_version.py``. They are parsed with
:mod:`ast`, so a file from any vLLM release can be probed, including small fixtures of one.

The one thing asked of the worker's interpreter is where its packages are (``importlib.util.find_spec``
locates a top-level package without importing it), and whether ``arctic_inference`` is installed: vLLM
before 0.34 refuses suffix decoding without it.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tuner.domain.capabilities import VllmCapabilities

Run = Callable[..., "subprocess.CompletedProcess[str]"]
log = logging.getLogger(__name__)

# Where vLLM has kept these declarations (newest layout first).
_SPECULATIVE_FILES = ("config/speculative.py", "config/__init__.py", "config.py")
_BACKEND_FILES = ("v1/attention/backends/registry.py", "attention/backends/registry.py")
_VERSION_FILES = ("_version.py", "version.py")

_LOCATE = (
    "import importlib.util as u, json\n"
    "v = u.find_spec('vllm')\n"
    "print(json.dumps({'vllm': list(v.submodule_search_locations)[0] if v and v.submodule_search_locations "
    "else None, 'arctic_inference': u.find_spec('arctic_inference') is not None}))\n"
)


class ProbeError(RuntimeError):
    """The vLLM installation could not be read (not found, or its source has no speculative config)."""


def probe_source(vllm_dir: str | Path, *, arctic_inference: bool | None = None) -> VllmCapabilities:
    """The capabilities declared in the vLLM package at ``vllm_dir`` (the directory holding its ``config``).

    ``arctic_inference``: whether that environment has the package (None: unknown), which decides
    ``suffix_ready`` where the source checks for it.
    """
    root = Path(vllm_dir)
    spec_path = _first(root, _SPECULATIVE_FILES, must_contain="class SpeculativeConfig")
    if spec_path is None:
        raise ProbeError(f"no SpeculativeConfig in {root} (looked in {', '.join(_SPECULATIVE_FILES)})")
    spec_source = spec_path.read_text()
    tree = ast.parse(spec_source)
    literals = _literal_aliases(tree)
    methods = literals.get("SpeculativeMethod", set())
    fields = _class_fields(tree, "SpeculativeConfig")
    notes: list[str] = []
    if not methods:
        notes.append("no SpeculativeMethod literal found: method names unknown")
    suffix_ready, suffix_note = _suffix(spec_source, methods, arctic_inference)
    backend_path = _first(root, _BACKEND_FILES, must_contain="class AttentionBackendEnum")
    backends = _enum_members(ast.parse(backend_path.read_text()), "AttentionBackendEnum") if backend_path else ()
    return VllmCapabilities(
        version=_version(root),
        methods=tuple(methods),
        spec_fields=tuple(fields),
        attention_backends=backends,
        rejection_sample_methods=tuple(sorted(literals.get("RejectionSampleMethod", ()))),
        suffix_ready=suffix_ready,
        suffix_note=suffix_note,
        source=str(root),
        notes=tuple(notes),
    )


def probe_python(python: str | None = None, run: Run = subprocess.run, timeout_s: float = 60.0) -> VllmCapabilities:
    """The capabilities of the vLLM that ``python`` (default: this interpreter) would import.

    Starts ``python`` once to locate the package (no import of vLLM); :class:`ProbeError` when it has none.
    """
    exe = python or sys.executable
    try:
        done = run([exe, "-c", _LOCATE], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ProbeError(f"could not run {exe}: {exc}") from exc
    try:
        found = json.loads((done.stdout or "").strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise ProbeError(f"{exe} did not say where vLLM is: {(done.stderr or '').strip()[-300:]}") from None
    if not found.get("vllm"):
        raise ProbeError(f"{exe} has no vllm package")
    return probe_source(found["vllm"], arctic_inference=bool(found.get("arctic_inference")))


def _first(root: Path, names: Iterable[str], *, must_contain: str) -> Path | None:
    for name in names:
        path = root / name
        if path.is_file() and must_contain in path.read_text():
            return path
    return None


def _literal_aliases(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level ``Name = Literal[...]`` aliases, each expanded to its strings (aliases nest)."""
    raw: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            value = node.value  # ``X: TypeAlias = Literal[...]``
        else:
            continue
        if isinstance(value, ast.Subscript) and _name(value.value) == "Literal":
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            assert isinstance(target, ast.Name)
            raw[target.id] = value.slice

    def expand(expr: ast.expr, seen: frozenset[str]) -> set[str]:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.Tuple):
            return set().union(*(expand(e, seen) for e in expr.elts)) if expr.elts else set()
        if isinstance(expr, ast.Name) and expr.id in raw and expr.id not in seen:
            return expand(raw[expr.id], seen | {expr.id})
        return set()

    return {name: expand(expr, frozenset({name})) for name, expr in raw.items()}


def _name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):  # typing.Literal
        return expr.attr
    return None


def _class_fields(tree: ast.Module, class_name: str) -> set[str]:
    """The annotated fields a caller may set (``field(init=False)`` ones are vLLM's own)."""
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        return set()
    out: set[str] = set()
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        value = node.value
        if isinstance(value, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords
        ):
            continue
        out.add(node.target.id)
    return out


def _enum_members(tree: ast.Module, class_name: str) -> tuple[str, ...]:
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        return ()
    names = [
        t.id
        for node in cls.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id.isupper()
    ]
    return tuple(names)


def _version(root: Path) -> str | None:
    for name in _VERSION_FILES:
        path = root / name
        if not path.is_file():
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign):
                continue
            targets = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if targets & {"__version__", "version"} and isinstance(node.value, ast.Constant):
                return str(node.value.value)
    return None


def _suffix(source: str, methods: set[str], arctic_inference: bool | None) -> tuple[bool | None, str | None]:
    """Whether suffix decoding can start: vLLM before 0.34 checks ``has_arctic_inference()`` at config time."""
    if "suffix" not in methods:
        return False, "this vLLM has no suffix decoding"
    if "has_arctic_inference" not in source:
        return True, None  # native (vLLM 0.34 on)
    if arctic_inference is None:
        return None, "suffix decoding needs the arctic-inference package; whether it is installed is unknown"
    if arctic_inference:
        return True, None
    return False, "suffix decoding needs the arctic-inference package, which is not installed beside this vLLM"


@functools.cache
def installed_capabilities(python: str | None = None) -> VllmCapabilities | None:
    """:func:`probe_python` once per interpreter and process (a worker's vLLM does not change under it);
    None, logged, when it cannot be read: the caller then assumes the names vLLM 0.32-0.34 take."""
    try:
        return probe_python(python)
    except ProbeError as exc:
        log.warning("vLLM's capabilities could not be read: %s", exc)
        return None


def capabilities_report(python: str | None = None) -> dict[str, Any] | None:
    """What a worker adds to its hardware report: :func:`installed_capabilities` as a dict, or None."""
    caps = installed_capabilities(python)
    return caps.to_dict() if caps is not None else None
