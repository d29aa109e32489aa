"""Manifests written by pyckpt validate against docs/manifest.schema.json, and the
schema rejects what the reader rejects for structural reasons."""

import json
import pathlib

import numpy as np
import pytest

import pyckpt
from pyckpt import _reference_reader

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = json.loads((pathlib.Path(__file__).parents[2] / "docs" / "manifest.schema.json").read_text())


def _validate(doc):
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def test_written_manifests_match_the_schema(ckpt_dir, rng):
    tree = {"a": [rng.standard_normal((3, 3)), {"b": np.zeros(0)}], "n": 3, "s": "text",
            "t": (1.5, None, b"x"), "e": {}}
    pyckpt.save(tree, ckpt_dir, metadata={"k": [1, 2]})
    _validate(_reference_reader.read_manifest(ckpt_dir))


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(version=2),
    lambda d: d["tensors"]["key"].__setitem__(0, "../x"),
    lambda d: d["files"][0].__setitem__("name", "../../etc/passwd"),
    lambda d: d["crc32c"].__setitem__(0, -1),
    lambda d: d["tensors"]["shape"].__setitem__(0, [-1]),
])
def test_schema_rejects_structural_errors(ckpt_dir, mutate):
    pyckpt.save({"a": np.ones(3)}, ckpt_dir)
    doc = _reference_reader.read_manifest(ckpt_dir)
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        _validate(doc)
