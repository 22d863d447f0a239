"""One bad value per instance field, derived from the field table (FIELDS): out of its bounds where it has bounds,
not one of its choices where it has choices, else a value of the wrong type; the fields whose type says little
(raw, free text with rules of its own) get a value that breaks their rule. Used by the unit test of the resolver
and by the fleet test that feeds them through site.yml's facts stage (every one refused before any host changes).
"""

from __future__ import annotations

# Fields whose rule is not their type: a value that breaks that rule.
RULE_BREAKERS = {
    "name": "Bad Name",  # the systemd instance name: a-z, 0-9, '.', '_', '-'
    "host": "10.0.0.1,10.0.0.2",  # one address, no lists
    "api_key": "one\ntwo",  # one key, no newlines or commas
    "tensor_split": "3,-1",  # non-negative numbers
    "replicas": 0,  # a positive integer or 'auto'
    "devices": [0, 0],  # distinct nvidia-smi indices
    "extra_args": ["--port", "9000"],  # a flag the role renders itself
    "environment": {"CUDA_VISIBLE_DEVICES": "1"},  # a variable the role sets itself
    "rope_scale": 2.0,  # only with rope_scaling
}
WRONG_TYPE = {"int": "many", "float": "much", "bool": "maybe", "list": "not-a-list", "dict": "not-a-dict"}


def bad_value(key, spec):
    """A value the resolver must refuse for this field."""
    if key in RULE_BREAKERS:
        return RULE_BREAKERS[key]
    if spec.get("choices"):
        return "not-a-choice"
    if "min" in spec:
        return spec["min"] - (1 if spec["type"] == "int" else 0.5)
    if "max" in spec:
        return spec["max"] + 1
    if spec["type"] in WRONG_TYPE:
        return WRONG_TYPE[spec["type"]]
    if spec["type"] in ("str", "path"):
        return ["not", "a", "string"]
    raise AssertionError(f"no bad value for field {key!r} ({spec['type']}): add one to RULE_BREAKERS")


def bad_instances(fields, model, first_port=8100):
    """field -> (instance label, one instance that is valid but for that field)."""
    out = {}
    for i, (key, spec) in enumerate(fields.items()):
        label = f"bad-{key.replace('_', '-')}"
        inst = {"name": label, "model": model, "port": first_port + i, key: bad_value(key, spec)}
        out[key] = (inst["name"], inst)
    return out
