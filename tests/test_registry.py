"""dfl.registry.Registry: decorator and call registration, clashes, lookups with choices, entry points."""

from importlib import metadata

import pytest

from dfl.registry import Registry, RegistryError


def test_register_by_decorator_and_call_keeps_order():
    reg = Registry("widget")

    @reg.register("a")
    def make_a():
        return "a"

    reg.register("b", str)
    assert reg.names() == ("a", "b")
    assert reg.get("a") is make_a and reg["b"] is str
    assert "a" in reg and "c" not in reg and len(reg) == 2


def test_unknown_name_lists_choices_and_suggests():
    reg = Registry("widget")
    reg.register("ring", int)
    reg.register("grid", float)
    with pytest.raises(ValueError, match=r"topology must be one of ring, grid; got 'rng' \(did you mean 'ring'\?\)"):
        reg.get("rng", field="topology")


def test_same_name_twice_is_an_error_naming_both_unless_replace():
    reg = Registry("algorithm")
    reg.register("x", int)
    reg.register("x", int)  # the same object again: harmless (a module imported twice)
    clash = r"algorithm 'x' is registered twice: by builtins.int and by builtins.float"
    with pytest.raises(RegistryError, match=clash):
        reg.register("x", float)
    reg.register("x", float, replace=True)
    assert reg.get("x") is float


@pytest.mark.parametrize("bad", ["", " x", 3])
def test_bad_names(bad):
    with pytest.raises(RegistryError, match="name must be a non-empty string"):
        Registry("model").register(bad, int)


class _EP:
    def __init__(self, name, value, obj=None, exc=None):
        self.name, self.value, self._obj, self._exc = name, value, obj, exc
        self.dist = type("D", (), {"name": "plugin-dist"})()

    def load(self):
        if self._exc:
            raise self._exc
        return self._obj


def test_entry_points_are_loaded_once_and_a_broken_one_is_named(monkeypatch):
    calls = []

    def fake(group):
        calls.append(group)
        return [_EP("good", "pkg.mod:Good", obj=dict), _EP("builtin", "pkg.mod:Other", obj=list),
                _EP("broken", "pkg.bad:Thing", exc=ImportError("No module named 'pkg.bad'"))]

    monkeypatch.setattr(metadata, "entry_points", fake)
    reg = Registry("model", group="dfl.models")
    reg.register("builtin", tuple)
    with pytest.warns(UserWarning, match=r"model 'builtin' from plugin-dist .* is ignored: the name is taken by "
                      r"builtins.tuple"):
        assert reg.names() == ("builtin", "good")
    assert reg.get("builtin") is tuple  # a built-in wins over a same-named plug-in
    assert reg.get("good") is dict and "plugin-dist" in reg.source("good")
    with pytest.raises(RegistryError, match=r"model 'broken' from plugin-dist .*pkg.bad:Thing.*No module named"):
        reg.get("broken")
    reg.names()
    assert calls == ["dfl.models"]


def test_check_vets_every_route_and_a_refused_plug_in_is_named(monkeypatch):
    def only_types(name, obj):
        if not isinstance(obj, type):
            raise TypeError(f"{name} must be a class")

    monkeypatch.setattr(metadata, "entry_points", lambda group: [_EP("plug", "pkg.mod:thing", obj=len)])
    reg = Registry("algorithm", group="dfl.algorithms", check=only_types)
    reg.register("ok", int)
    with pytest.raises(TypeError, match="bad must be a class"):
        reg.register("bad", len)
    assert reg.names() == ("ok",)
    with pytest.raises(RegistryError, match=r"algorithm 'plug' from plugin-dist .* TypeError: plug must be a class"):
        reg.get("plug")
