"""Write the KServe JSON Schema that tests/deploy validates manifests against, from the `kserve`
wheel's generated OpenAPI models (the wheel ships no CRD YAML).

    pip download --no-deps kserve==0.21.0 -d /tmp/kserve
    python deploy/schemas/kserve_schema.py /tmp/kserve/kserve-0.21.0-py3-none-any.whl \
        > deploy/schemas/kserve-v0.21.0.schema.json

Each model class becomes a `$defs` entry whose properties are the class's `attribute_map` (the
JSON names) typed from its `openapi_types`; unknown properties are refused, so a misspelt field
fails. Kubernetes types (V1Container, V1Probe, ...) refer to the definitions that
kubernetes-validate ships (`https://kubernetes.io/api/_definitions.json`), which the tests register
beside this schema. Which fields are required is not in the models and is not checked here.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile

K8S_VERSION = "1.37.0"
K8S_ID = "https://kubernetes.io/api/_definitions.json"
SCALARS = {"str": {"type": "string"}, "int": {"type": "integer"}, "bool": {"type": "boolean"},
           "float": {"type": "number"}, "object": {}, "datetime": {"type": "string"},
           "ResourceQuantity": {"$ref": f"{K8S_ID}#/$defs/io.k8s.apimachinery.pkg.api.resource.Quantity"},
           # referenced by the models but not generated into the wheel: a quantity like "4" or 4
           "V1beta1MetricQuantity": {"$ref": f"{K8S_ID}#/$defs/io.k8s.apimachinery.pkg.api.resource.Quantity"}}
# Classes of the Kubernetes client that live outside core/v1, and the one meta type.
K8S_GROUPS = {"V1ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
ROOTS = {"ServingRuntime": ("V1alpha1ServingRuntime", "serving.kserve.io/v1alpha1"),
         "ClusterServingRuntime": ("V1alpha1ClusterServingRuntime", "serving.kserve.io/v1alpha1"),
         "InferenceService": ("V1beta1InferenceService", "serving.kserve.io/v1beta1")}


def _dict_literal(source: str, name: str) -> dict[str, str]:
    match = re.search(rf"{name} = (\{{.*?\}})", source, re.S)
    return ast.literal_eval(match.group(1)) if match else {}


def _k8s_ref(name: str, k8s_names: set[str]) -> dict[str, object]:
    if name in K8S_GROUPS:
        return {"$ref": f"{K8S_ID}#/$defs/{K8S_GROUPS[name]}"}
    parts = re.match(r"K8sIoApi([A-Z][a-z]+)(V\d\w*?)([A-Z]\w*)$", name)
    if parts:
        candidate = f"io.k8s.api.{parts.group(1).lower()}.{parts.group(2).lower()}.{parts.group(3)}"
    else:
        versioned = re.match(r"(V\d\w*?)([A-Z]\w*)$", name)
        found = sorted(n for n in k8s_names if versioned and n.startswith("io.k8s.api.")
                       and n.endswith(f".{versioned.group(1).lower()}.{versioned.group(2)}"))
        candidate = found[0] if found else ""
    return {"$ref": f"{K8S_ID}#/$defs/{candidate}"} if candidate in k8s_names else {}


def _type(text: str, classes: set[str], k8s_names: set[str]) -> dict[str, object]:
    text = text.strip()
    if text in SCALARS:
        return SCALARS[text]
    if text.startswith("list[") and text.endswith("]"):
        return {"type": ["array", "null"], "items": _type(text[5:-1], classes, k8s_names)}
    if text.startswith("dict(") and text.endswith(")"):
        value = text[5:-1].split(",", 1)[1]
        return {"type": ["object", "null"], "additionalProperties": _type(value, classes, k8s_names)}
    if text in classes:
        return {"$ref": f"#/$defs/{text}"}
    return _k8s_ref(text, k8s_names)


def build(wheel: str, k8s_names: set[str]) -> dict[str, object]:
    sources = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("kserve/models/") and name.endswith(".py"):
                source = archive.read(name).decode()
                cls = re.search(r"^class (\w+)\(object\):", source, re.M)
                if cls:
                    sources[cls.group(1)] = source
    classes = set(sources)
    defs: dict[str, object] = {}
    for cls, source in sorted(sources.items()):
        types, names = _dict_literal(source, "openapi_types"), _dict_literal(source, "attribute_map")
        if not types:  # a value type (MetricQuantity): a string or a number
            defs[cls] = {"type": ["string", "number", "integer"]}
            continue
        defs[cls] = {"type": "object", "additionalProperties": False,
                     "properties": {names[attr]: _type(kind, classes, k8s_names) for attr, kind in types.items()}}
    for kind, (cls, api_version) in ROOTS.items():
        defs[kind] = {"allOf": [{"$ref": f"#/$defs/{cls}"}],
                      "properties": {"apiVersion": {"const": api_version}, "kind": {"const": kind}},
                      "required": ["apiVersion", "kind", "metadata", "spec"]}
    version = re.search(r"kserve-([\d.]+)-", wheel)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"urn:pystub:kserve-{version.group(1) if version else 'unknown'}",
            "description": "Generated by deploy/schemas/kserve_schema.py from the kserve wheel's OpenAPI models.",
            "$defs": defs}


def main() -> None:
    import kubernetes_validate.utils as utils

    k8s = utils.schema_contents(f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/_definitions.json", K8S_VERSION)
    json.dump(build(sys.argv[1], set(k8s["$defs"])), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
