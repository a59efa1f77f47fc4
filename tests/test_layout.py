"""The README's "Layout" names every module and package of ``tuner/`` and nothing that does not exist; the tests
mirror ``tuner/`` and share code only through conftest files and helper modules (docs/testing.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout") :]
    return section[section.index("```") + 3 : section.index("```", section.index("```") + 3)]


def test_every_module_of_tuner_is_in_the_layout() -> None:
    layout = _layout()
    named = set(re.findall(r"[\w./]+\.py|tuner/\w+/", layout))
    # a line may name siblings after the first path ("tuner/cli.py, demo.py"): resolve them in its folder
    for line in layout.splitlines():
        head = re.match(r"(tuner/(?:\w+/)?)", line.strip())
        if head:
            named |= {head.group(1) + n for n in re.findall(r"\b(\w+\.py)\b", line)}
    missing = []
    for path in sorted((ROOT / "tuner").iterdir()):
        rel = path.relative_to(ROOT).as_posix()
        if path.name.startswith(("_", ".")) or path.name == "py.typed":
            continue
        key = rel + "/" if path.is_dir() else rel
        if key not in named and Path(rel).name not in named:
            missing.append(key)
    assert not missing, f"not in the README's Layout: {missing}"
    for module in sorted((ROOT / "tuner" / "domain").glob("*.py")):
        if module.name != "__init__.py":
            assert module.name in layout, f"tuner/domain/{module.name} is not in the README's Layout"


def test_every_path_the_layout_names_exists() -> None:
    for path in re.findall(r"^([\w./-]+/|[\w./-]+\.py)\s", _layout(), re.M):
        assert (ROOT / path).exists(), f"the README's Layout names {path}, which does not exist"


def test_the_tests_mirror_the_source_tree() -> None:
    """tests/test_<module>.py tests tuner/<module>.py and tests/<package>/ tests tuner/<package>/ (docs/testing.md);
    tests/e2e/ is the whole service, and this file the README."""
    tests = ROOT / "tests"
    strays = []
    for test in sorted(tests.rglob("test_*.py")):
        folder = test.parent.relative_to(tests)
        if folder.parts[:1] == ("e2e",) or test == Path(__file__).resolve():
            continue
        if not (ROOT / "tuner" / folder).is_dir():
            strays.append(test.relative_to(ROOT).as_posix())
        elif folder == Path(".") and not (ROOT / "tuner" / f"{test.stem.removeprefix('test_')}.py").exists():
            strays.append(test.relative_to(ROOT).as_posix())
    assert not strays, f"tests that do not mirror a module or package of tuner/: {strays}"


def test_no_test_module_imports_another() -> None:
    """What tests share lives in conftest fixtures and plain helper modules (docs/testing.md), never in
    another test module: importing one runs its module body and ties two tests' files together."""
    imports = re.compile(r"^\s*(?:from|import)\s+(?:tests\.)?(?:[\w.]+\.)?(test_\w+)\b", re.M)
    offenders = [
        f"{test.relative_to(ROOT).as_posix()} imports {name}"
        for test in sorted((ROOT / "tests").rglob("*.py"))
        for name in imports.findall(test.read_text())
    ]
    assert not offenders, offenders
