"""mono_common.bench.side_tree: another checkout's packages beside this process's own."""

import sys

import pytest

from mono_common.bench.side_tree import SideTree


def _tree(root, version):
    pkg = root / "src" / "fakepkg_side"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (pkg / "sub" / "__init__.py").write_text("")
    # a lazy import inside a function resolves through sys.modules when called
    (pkg / "sub" / "mod.py").write_text(
        "def version():\n    import fakepkg_side\n    return fakepkg_side.VERSION\n")
    return str(root / "src")


def test_side_tree_imports_beside_the_current_packages_and_restores_them(tmp_path, monkeypatch):
    here = _tree(tmp_path / "here", "new")
    base = _tree(tmp_path / "base", "old")
    monkeypatch.syspath_prepend(here)
    import fakepkg_side.sub.mod as cur

    side = SideTree([base], packages=("fakepkg_side",))
    old = side.module("fakepkg_side.sub.mod")
    assert old is not cur
    assert sys.modules["fakepkg_side.sub.mod"] is cur  # set aside again
    assert cur.version() == "new"
    with side:
        assert old.version() == "old"  # its lazy import sees its own tree inside `with`
        assert sys.modules["fakepkg_side"].VERSION == "old"
    assert sys.modules["fakepkg_side"].VERSION == "new"
    assert side.module("fakepkg_side.sub.mod") is old  # imported once, kept while set aside
    for k in [k for k in sys.modules if k.startswith("fakepkg_side")]:
        del sys.modules[k]


def test_side_tree_refuses_folders_without_the_packages(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        SideTree([str(tmp_path / "nope")], packages=("fakepkg_side",))
    (tmp_path / "src").mkdir()
    with pytest.raises(FileNotFoundError, match="fakepkg_side are in none of"):
        SideTree([str(tmp_path / "src")], packages=("fakepkg_side",))
