"""The stand-in's "decoding": values drawn from the user's message, shaped by a JSON schema or a
regular expression, so that what it writes always follows what it was guided by."""

import json
import re

try:
    from re import _parser as sre_parse  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse


class Words:
    """The message's numbers and capitalised words, handed out in order (then the message itself)."""

    def __init__(self, message):
        self.message = message
        self._numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", message)]
        names = re.findall(r"\b[A-Z][\w-]*", message)
        self._names = names[1:] if names and message.startswith(names[0]) else names
        self._strings = 0

    def number(self, integral):
        value = self._numbers.pop(0) if self._numbers else 1.0
        return int(value) if integral else value

    def text(self):
        if self._names:
            return self._names.pop(0)
        self._strings += 1
        words = re.findall(r"\w+", self.message)
        return words[-self._strings % len(words)] if words else "text"

    def mentioned(self, options):
        """The first option the message names, else None."""
        lowered = self.message.lower()
        return next((option for option in options if str(option).lower() in lowered), None)


def instance(schema, words, definitions=None):
    """A value that follows `schema` (the JSON Schema constructs LangChain and pydantic write)."""
    definitions = definitions if definitions is not None else {**schema.get("$defs", {}),
                                                               **schema.get("definitions", {})}
    if "$ref" in schema:
        return instance(definitions[schema["$ref"].rsplit("/", 1)[-1]], words, definitions)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return words.mentioned(schema["enum"]) or schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return instance(_branch(schema[key], words), words, definitions)
    if "allOf" in schema:
        return instance({k: v for part in schema["allOf"] for k, v in part.items()}, words, definitions)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return _VALUES[kind](schema, words, definitions)


def _branch(branches, words):
    """The branch whose const or enum the message names (a tool's name), else the first not null."""
    for branch in branches:
        names = [p.get("const") for p in branch.get("properties", {}).values()] + \
            [e for p in branch.get("properties", {}).values() for e in p.get("enum", [])]
        if words.mentioned([n for n in names if isinstance(n, str)]):
            return branch
    return next((b for b in branches if b.get("type") != "null"), branches[0])


def _object(schema, words, definitions):
    return {name: instance(sub, words, definitions) for name, sub in schema.get("properties", {}).items()}


def _array(schema, words, definitions):
    count = max(schema.get("minItems", 1), 1)
    count = min(count, schema.get("maxItems", count))
    return [instance(schema.get("items", {}), words, definitions) for _ in range(count)]


def _string(schema, words, definitions):
    if "pattern" in schema:
        return from_regex(schema["pattern"])
    if schema.get("format") == "date":
        return "2024-01-01"
    text = words.text()
    return text.ljust(schema.get("minLength", 0), "x")[:schema.get("maxLength", None)]


def _number(integral):
    def value(schema, words, definitions):
        number = words.number(integral)
        low, high = schema.get("minimum", number), schema.get("maximum", number)
        return min(max(number, low), high)
    return value


_VALUES = {"object": _object, "array": _array, "string": _string, "integer": _number(True),
           "number": _number(False), "boolean": lambda s, w, d: True, "null": lambda s, w, d: None}


def json_object(words):
    """json_object mode (no schema): the keys the message writes in backticks, else one "text" key,
    with the message's capitalised words and numbers as values, in the order it has them."""
    keys = re.findall(r"`(\w+)`", words.message) or ["text"]
    found = re.findall(r"(?<!`)\b(?:[A-Z][\w-]*|-?\d+(?:\.\d+)?)\b", words.message)
    values = [_value(v) for v in (found[1:] if found and words.message.startswith(found[0]) else found)]
    return {key: values.pop(0) if values else words.text() for key in keys}


def _value(text):
    try:
        return int(text)
    except ValueError:
        return float(text) if text[-1].isdigit() else text


def from_regex(pattern):
    """A shortest-ish text the regular expression matches (literals, classes, groups, repeats)."""
    return _emit(sre_parse.parse(pattern))


def _emit(parsed):
    out = []
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name in ("NOT_LITERAL", "ANY"):
            out.append("a" if name == "ANY" or chr(arg) != "a" else "b")
        elif name == "IN":
            out.append(_in(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            out.append(_emit(sub) * (low or min(1, high)))
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            out.append(_emit(arg[-1]))
        elif name == "BRANCH":
            out.append(_emit(arg[1][0]))
        elif name == "CATEGORY":
            out.append(_category(arg))
        elif name != "AT":
            raise ValueError(f"the stand-in cannot follow the regular expression construct {name}")
    return "".join(out)


def _category(category):
    name = str(category)
    return "0" if "DIGIT" in name and "NOT" not in name else " " if "SPACE" in name and "NOT" not in name else "a"


def _in(items):
    if items and str(items[0][0]) == "NEGATE":
        return "~"
    op, arg = items[0]
    if str(op) == "LITERAL":
        return chr(arg)
    if str(op) == "RANGE":
        return chr(arg[0])
    return _category(arg)


def guided(fields, words):
    """The text guided decoding allows (vLLM's GuidedDecodingParams fields)."""
    if fields.get("json") is not None:
        schema = fields["json"]
        return json.dumps(instance(json.loads(schema) if isinstance(schema, str) else schema, words))
    if fields.get("json_object"):
        return json.dumps(json_object(words))
    if fields.get("choice"):
        return words.mentioned(fields["choice"]) or fields["choice"][0]
    if fields.get("regex") is not None:
        return from_regex(fields["regex"])
    raise ValueError(f"the stand-in cannot follow guided decoding of {sorted(fields)}")
