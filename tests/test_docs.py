"""The docs that describe the code name all of it: nothing drifts unnoticed."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).parents[1]


def test_the_architecture_module_map_names_every_module():
    # docs/architecture.md's module map is a newcomer's first look at the
    # code: a module missing there is one nobody finds.
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "smartexec").rglob("*.py"))
        if path.name != "__init__.py"
        and str(path.relative_to(ROOT)) not in text
        and f"`{path.name}`" not in text
    ]
    assert not missing, f"docs/architecture.md's module map lacks {missing}"
