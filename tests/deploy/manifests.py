"""Offline validation of what deploy/ holds: Kubernetes objects against kubernetes-validate's
schemas (strict: unknown fields fail), KServe objects against deploy/schemas/kserve-*.schema.json
(generated from the kserve wheel's models) and KEDA ScaledObjects against the structural schema
beside it; the embedded Kubernetes types of both resolve to kubernetes-validate's definitions.
The Helm chart is rendered and linted by helm-python-sdk (Helm's own engine, no binary)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import yaml
from harness import ROOT
from jsonschema.validators import Draft202012Validator
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

K8S_VERSION = "1.37.0"
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "pystub-backend"
EXAMPLE_VALUES = sorted((DEPLOY / "helm" / "examples").glob("values-*.yaml"))
KSERVE_MANIFESTS = sorted((DEPLOY / "kserve").glob("*.yaml"))
KSERVE_KINDS = {"ServingRuntime", "ClusterServingRuntime", "InferenceService"}


@cache
def _schemas() -> tuple[Registry, dict[str, Any], dict[str, Any]]:
    k8s = kv_utils.schema_contents(f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/_definitions.json", K8S_VERSION)
    kserve = json.loads(next((DEPLOY / "schemas").glob("kserve-v*.schema.json")).read_text())
    keda = json.loads((DEPLOY / "schemas" / "keda-scaledobject-v1alpha1.schema.json").read_text())
    registry: Registry = Registry().with_resources(
        [(k8s["$id"], Resource.from_contents(k8s)), (kserve["$id"], Resource.from_contents(kserve)),
         (keda["$id"], Resource.from_contents(keda))])
    return registry, kserve, keda


def validate(document: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError or kubernetes_validate.ValidationError for an invalid object."""
    registry, kserve, keda = _schemas()
    kind = document.get("kind")
    if kind in KSERVE_KINDS:
        schema = {"$ref": f"{kserve['$id']}#/$defs/{kind}"}
    elif kind == "ScaledObject":
        schema = {"$ref": keda["$id"]}
    else:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
        return
    Draft202012Validator(schema, registry=registry).validate(document)


def load_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(values: dict[str, Any] | None = None, name: str = "demo",
           namespace: str = "serving") -> list[dict[str, Any]]:
    """Every object the chart renders with `values` (merged over values.yaml by Helm)."""
    rendered = helm_python.Chart.load(str(CHART)).render(values or {}, name=name, namespace=namespace)
    return [doc for _, text in sorted(rendered.items()) for doc in load_documents(text)]


def values_file(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for document in documents:
        assert document["kind"] not in found, f"two objects of kind {document['kind']}"
        found[document["kind"]] = document
    return found
