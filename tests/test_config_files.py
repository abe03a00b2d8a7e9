"""A TOML config is read through one reader whose every failure is one
line naming the file; wrong keys and values are all reported at once, each with the file and the key; a key
that belongs in an `*_options` table says which; the Python API raises dfl's own errors for wrong types."""

from __future__ import annotations

import pytest

import dfl
from dfl.config import Config
from dfl.engine.validation import option_owner
from dfl.errors import ArgumentError, ConfigError


def _toml(tmp_path, content: bytes | str, name: str = "c.toml"):
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.mark.parametrize("content,message", [
    (b"\xff\xfec\x00l\x00", "is UTF-16 text; save it as UTF-8"),
    ("rounds = 3".encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
    (b"rounds = 3\n\xe9\n", r"is not UTF-8 text: byte 0xe9 at line 2, column 1"),
    (b"rounds = \n", r"is not valid TOML: Invalid value \(at line 1, column 10\)"),
    (b"[[x]\n", "is not valid TOML"),
    (b"a = " + b"[" * 5000 + b"]" * 5000, "is not valid TOML"),
])
def test_an_unreadable_config_file_is_one_line_naming_it(tmp_path, content, message):
    path = _toml(tmp_path, content)
    with pytest.raises(ConfigError, match=message) as info:
        Config.from_toml(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_and_directory_config_files(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*nope.toml: does not exist"):
        Config.from_toml(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        Config.from_toml(tmp_path)


def test_utf8_bom_file_loads(tmp_path):
    assert Config.from_toml(_toml(tmp_path, b"\xef\xbb\xbfrounds = 3\n")).rounds == 3


def test_every_mistake_of_a_file_is_reported_with_the_file_and_the_key(tmp_path):
    path = _toml(tmp_path, 'clients = 0\nlr = -1\ntopology = ["ring"]\nrounds = 2.5\nrnds = 3\n'
                           'seed = {a = 1}\nmatrix = "W.npy"\n')
    with pytest.raises(ConfigError) as info:
        Config.from_toml(path, owner=option_owner)
    problems = info.value.problems
    assert len(problems) == 7 and all(p.startswith(f"config file {path}: ") for p in problems)
    text = str(info.value)
    assert "\n" not in text
    for part in ("clients must be >= 1, got 0", "lr must be > 0.0, got -1", "topology must be a string, got list "
                 "['ring']", "rounds must be an integer >= 1, got 2.5", "unknown config field 'rnds' (did you mean "
                 "'rounds'?)", "seed must be an integer", "matrix is an option of topology custom: set it in "
                 "[topology_options]"):
        assert part in text


@pytest.mark.parametrize("key,table", [("matrix", "topology_options"), ("degree", "topology_options"),
                                       ("num_samples", "dataset_options"), ("shards_per_client", None),
                                       ("classes_per_client", "partition_options"), ("hidden", "model_options"),
                                       ("sigma", "partition_options")])
def test_a_key_of_an_options_table_names_the_table(tmp_path, key, table):
    path = _toml(tmp_path, f"{key} = 1\n")
    with pytest.raises(ConfigError) as info:
        Config.from_toml(path, owner=option_owner)
    if table is None:
        assert "goes in its table" in str(info.value)
    else:
        assert f"set it in [{table}]" in str(info.value)


def test_the_cli_reads_a_config_file_with_the_hints(tmp_path, capsys):
    path = _toml(tmp_path, 'topology = "custom"\nmatrix = "W.npy"\n')
    assert dfl.cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[topology_options]" in err and str(path) in err


# ------------------------------------------------------------------------------------------------ the API
def test_python_api_wrong_types_raise_dfl_errors():
    with pytest.raises(ArgumentError, match="config must be a dfl.Config .*got str"):
        dfl.run("not a config")
    with pytest.raises(TypeError):  # an ArgumentError is the TypeError Python users expect
        dfl.validate(["not", "a", "config"])
    with pytest.raises(ArgumentError, match="data must be a dfl.data.FederatedData .*got str"):
        dfl.run(Config(rounds=1), data="garbage")
    with pytest.raises(ArgumentError, match="out must be a directory path"):
        dfl.run(Config(rounds=1), out=5)
    with pytest.raises(ArgumentError, match="data_root must be a string, got 5"):  # when the Config is built
        Config(data_root=5)
    with pytest.raises(ArgumentError, match="topology must be a string, got list"):
        Config().replace(topology=["ring"])
    config = Config(clients=0)  # the right type, out of range: built, and refused by validate
    with pytest.raises(ConfigError, match="clients must be >= 1, got 0"):
        dfl.validate(config)
    with pytest.raises(ConfigError, match="a config is a table of fields .*got list"):
        Config.from_dict([("rounds", 3)])
    with pytest.raises(ConfigError, match="config keys are field names"):
        Config.from_dict({3: 4})


def test_all_wrong_fields_of_a_config_are_reported_at_once():
    with pytest.raises(ArgumentError) as info:  # two of the wrong type: refused when built, with the other two
        Config(clients=0, lr="fast", device="gpu", loggers="tensorboard")
    assert len(info.value.problems) == 4
    with pytest.raises(ConfigError) as info:
        Config(clients=0, lr=-1.0, device="gpu").validate()
    assert len(info.value.problems) == 3


def test_a_refused_value_of_the_config_file_names_the_file(tmp_path, capsys):
    # a value the file set and no flag replaced: the message names the file, as its type errors do
    path = _toml(tmp_path, 'topology = "Ring"\n')
    assert dfl.cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dfl run: error: config file {path}: topology must be one of") and "'ring'" in err
    assert dfl.cli.main(["run", str(path), "--topology", "Rnig"]) == 2  # the flag's value: no file named
    err = capsys.readouterr().err
    assert err.startswith("dfl run: error: topology must be one of") and err.count("\n") == 1


def test_mistakes_of_every_kind_in_a_file_are_said_at_once(tmp_path, capsys, monkeypatch):
    """A key that is no field, a value out of range, a rule between fields and a component's name: four kinds,
    each found by another stage of the checks, all in one line; a flag that replaces a wrong value removes it."""
    monkeypatch.chdir(tmp_path)
    path = _toml(tmp_path, 'roudns = 5\nlr = -1\ntopology = "rign"\nwarmup_rounds = 300\nalgorithm = "dpsgd"\n'
                           'rho = 0.1\n')
    assert dfl.cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for part in ["unknown config field 'roudns' (did you mean 'rounds'?)", "lr must be > 0.0, got -1",
                 "warmup_rounds must be < rounds = 200", "rho = 0.1 is not read by dpsgd", "topology must be one of"]:
        assert f"config file {path}: {part}" in err, err
    assert "got 'rign' (did you mean 'ring'?)" in err
    assert dfl.cli.main(["run", str(path), "--lr", "0.1", "--topology", "ring", "--warmup-rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert "roudns" in err and "rho = 0.1" in err and "lr must" not in err and "rign" not in err
    assert not (tmp_path / "runs").exists()  # refused before any run directory


@pytest.mark.parametrize("changes,message", [
    ({"clients": 10**20}, "clients must be an integer that fits in 64 bits"),
    ({"rounds": -(10**30)}, "rounds must be an integer that fits in 64 bits"),
    ({"lr": 10**400}, "lr must be a number within the float range"),
    ({"lr_milestones": [10**20]}, "lr_milestones must be a list of integers"),
    ({"clients": 10**5000}, "got an integer of 16610 bits"),
    ({"dataset_options": {"num_samples": 10**20}}, "num_samples must be an integer that fits in 64 bits"),
    ({"dataset_options": {"test_fraction": 10**400}}, "test_fraction must be an integer that fits in 64 bits"),
    ({"dataset_options": {"test_fraction": 1e300}}, r"dataset_options.test_fraction must be in \(0, 1\), got 1e\+300"),
    ({"seed": 2**64}, r"seed must be an integer in \[0, 2\^63 - 1\]"),
])
def test_integers_too_large_for_c_are_refused_as_such(changes, message):
    with pytest.raises(ConfigError, match=message):
        dfl.validate(Config(**changes))
