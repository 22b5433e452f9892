#!/usr/bin/env python3
"""Checks schemas/recipe.schema.json with an independent validator (python3-jsonschema):
it is a valid draft 2020-12 schema, it accepts every shipped recipe (with its bases merged), and
it rejects recipes with typical mistakes. Usage: json_schema_check.py SOURCE_DIR"""
import copy
import json
import pathlib
import sys

import jsonschema
import yaml

root = pathlib.Path(sys.argv[1])
schema = json.loads((root / "schemas/recipe.schema.json").read_text())
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)


def merge(bottom, top):
    for key, value in top.items():
        if isinstance(bottom.get(key), dict) and isinstance(value, dict):
            merge(bottom[key], value)
        else:
            bottom[key] = value
    return bottom


def load(path):
    doc = yaml.safe_load(path.read_text()) or {}
    bases = doc.pop("base", [])
    merged = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merge(merged, load((path.parent / base).resolve()))
    return merge(merged, doc)


failures = []
# recipes/common/ holds partial recipes meant only as bases.
recipes = sorted(p for p in (root / "recipes").rglob("*.yaml") if p.parent.name != "common")
for path in recipes:
    # As an editor sees the file (alone), and as the engine sees it (bases merged).
    for view, doc in (("as written", yaml.safe_load(path.read_text())), ("with bases merged", load(path))):
        errors = list(validator.iter_errors(doc))
        if errors:
            failures.append(f"{path} ({view}): rejected by the JSON Schema: {errors[0].message}")

quickstart = load(root / "recipes/quickstart.yaml")
mistakes = {
    "unknown key": ("train", "lerning_rate", 0.1),
    "wrong type": ("train", "steps", "many"),
    "out of range": ("train", "steps", 0),
    "bad enum": ("optimizer", "type", "adam"),
    "key of another variant": ("optimizer", "momentum", 0.9),
    "key of another arch": ("model", "rope_theta", 10000.0),
}
for name, (section, key, value) in mistakes.items():
    bad = copy.deepcopy(quickstart)
    bad[section][key] = value
    if validator.is_valid(bad):
        failures.append(f"the JSON Schema accepts a recipe with a mistake: {name} ({section}.{key}: {value!r})")
bad = copy.deepcopy(quickstart)
bad["zero"] = {"stage": 2}
if validator.is_valid(bad):
    failures.append("the JSON Schema accepts a reserved section")
bad = copy.deepcopy(quickstart)
del bad["model"]["arch"]
if validator.is_valid(bad):
    failures.append("the JSON Schema accepts a recipe without model.arch")

for failure in failures:
    print(failure)
print(f"checked {len(recipes)} recipes and {len(mistakes) + 2} mistakes: {len(failures)} failures")
sys.exit(1 if failures else 0)
