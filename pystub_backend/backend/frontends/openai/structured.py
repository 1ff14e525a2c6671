"""Structured output: what the request asks of the text's form, as vLLM's guided decoding.

    response_format {"type": "json_object"}                      json_object: true
    response_format {"type": "json_schema", "json_schema": {"schema": S, ...}}   json: S
    guided_json / guided_regex / guided_choice / guided_grammar   json / regex / choice / grammar
    guided_decoding_backend, guided_whitespace_pattern            backend, whitespace_pattern
    structured_outputs {json, regex, choice, grammar, json_object, structural_tag, ...}  the same names

The result (`Guide`) travels in `sampling_parameters` as `"guided_decoding"`: the JSON text of
vLLM's `GuidedDecodingParams` fields, which is what vLLM's Triton backend reads (it builds
`GuidedDecodingParams(**json.loads(value))`). Only a model that declares it follows them is sent
one (contract.py); for any other the request is a 400 that says so. At most one kind per request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pystub_backend.backend.frontends.openai.errors import invalid

__all__ = ["Guide", "guide_of", "GUIDE_KINDS", "SAMPLING_KEY"]

SAMPLING_KEY = "guided_decoding"
GUIDE_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_OPTIONS = ("backend", "whitespace_pattern")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
           "guided_decoding_backend": "backend", "guided_whitespace_pattern": "whitespace_pattern"}
_TYPES: dict[str, tuple[type, ...]] = {"json": (dict, str), "regex": (str,), "choice": (list,), "grammar": (str,),
                                       "json_object": (bool,), "structural_tag": (str, dict), "backend": (str,),
                                       "whitespace_pattern": (str,)}


@dataclass(frozen=True)
class Guide:
    """vLLM's GuidedDecodingParams fields, and the request field that asked for them."""

    fields: dict[str, Any]
    param: str

    @property
    def kind(self) -> str:
        return next(kind for kind in GUIDE_KINDS if kind in self.fields)

    def sampling_value(self) -> str:
        return json.dumps(self.fields, ensure_ascii=False)


def _checked(fields: dict[str, Any], name: str, value: object, param: str) -> None:
    if not isinstance(value, _TYPES[name]) or (isinstance(value, list) and not all(isinstance(c, str) for c in value)):
        raise invalid(f"'{param}' has the wrong type for guided decoding's '{name}'", param)
    if value is not False:  # json_object: false asks for nothing
        fields[name] = value


def _response_format(document: dict[str, Any], fields: dict[str, Any]) -> None:
    form = document.get("response_format")
    if form is None:
        return
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "json_object":
        fields["json_object"] = True
    elif kind == "json_schema":
        schema = form.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("schema", {}), dict):
            raise invalid("'response_format.json_schema' must be an object with the JSON schema under 'schema'",
                          "response_format")
        fields["json"] = schema.get("schema", {})
    elif kind != "text":
        raise invalid("'response_format.type' must be 'text', 'json_object' or 'json_schema'", "response_format")


def guide_of(document: dict[str, Any]) -> Guide | None:
    """The structured output the request asks for, or None. Raises OpenAIError(400)."""
    fields: dict[str, Any] = {}
    param = None
    outputs = document.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise invalid("'structured_outputs' must be an object", "structured_outputs")
        for name in (*GUIDE_KINDS, *_OPTIONS):
            if outputs.get(name) is not None:
                _checked(fields, name, outputs[name], "structured_outputs")
                param = "structured_outputs"
    for given, name in _GUIDED.items():
        if document.get(given) is not None:
            _checked(fields, name, document[given], given)
            param = param or given
    before = len(fields)
    _response_format(document, fields)
    param = param or ("response_format" if len(fields) > before else None)
    kinds = [kind for kind in GUIDE_KINDS if kind in fields]
    if len(kinds) > 1:
        raise invalid(f"one kind of structured output at a time: the request asks for {' and '.join(kinds)}", param)
    return Guide(fields, param or "response_format") if kinds else None
