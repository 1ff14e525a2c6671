"""The Helm chart and the KServe manifests: valid against the Kubernetes, KServe and KEDA schemas
offline, wired consistently (selectors, targets, ports, grace period), and their commands, probes
and autoscaling metrics checked against a real pystub-backend."""

from __future__ import annotations

import copy
import re
import urllib.request
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from harness import EXAMPLES, Backend
from manifests import CHART, EXAMPLE_VALUES, KSERVE_MANIFESTS, by_kind, load_documents, render, validate, values_file

VALUE_SETS = {"default": {}, "keda": {"autoscaling": {"enabled": True, "engine": "keda"}},
              "hpa": {"autoscaling": {"enabled": True, "engine": "hpa"}, "probes": {"grpc": True}},
              "client-shm": {"shmSizeLimit": "256Mi"},
              **{path.name: values_file(path) for path in EXAMPLE_VALUES}}
ADAPTER_VALUES = CHART.parent / "examples" / "prometheus-adapter-values.yaml"


def test_the_chart_lints_without_errors_or_warnings() -> None:
    result = helm_python.lint(str(CHART), strict=True)
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > 1] == []  # 1 is INFO ("icon is recommended")


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid(values: dict[str, Any]) -> None:
    documents = render(values)
    kinds = {d["kind"] for d in documents}
    assert {"Deployment", "Service", "PodDisruptionBudget"} <= kinds
    for document in documents:
        validate(document)


@pytest.mark.parametrize("path", KSERVE_MANIFESTS, ids=lambda p: p.name)
def test_the_kserve_manifests_are_valid(path: Path) -> None:
    documents = load_documents(path.read_text())
    assert documents
    for document in documents:
        validate(document)


def _mutated(document: dict[str, Any], path: str, key: str, value: object) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    target = changed
    for part in path.split("."):
        target = target[int(part)] if part.isdigit() else target[part]
    target[key] = value
    return changed


@pytest.mark.parametrize(("kind", "path", "key", "value"), [
    ("ServingRuntime", "spec", "supportedModelFormat", []),  # misspelt field
    ("ServingRuntime", "spec.containers.0", "imagePullPolice", "Always"),  # in the embedded Container
    ("InferenceService", "spec.predictor", "minReplicas", "two"),
    ("Deployment", "spec.template.spec", "terminationGracePeriod", 30),
    ("ScaledObject", "spec.triggers.0", "metadata", {"serverAddress": "http://p:9090", "query": "up"}),
])
def test_the_validation_refuses_broken_objects(kind: str, path: str, key: str, value: object) -> None:
    pool = render(VALUE_SETS["keda"]) + [d for p in KSERVE_MANIFESTS for d in load_documents(p.read_text())]
    document = next(d for d in pool if d["kind"] == kind)
    validate(document)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(_mutated(document, path, key, value))


def test_the_chart_refuses_a_grace_period_shorter_than_the_drain() -> None:
    with pytest.raises(helm_python.HelmError, match="must exceed exitTimeoutSeconds"):
        render({"exitTimeoutSeconds": 60, "terminationGracePeriodSeconds": 45})


@pytest.mark.parametrize(("values", "text"), [
    ({"imag": {"repository": "x"}}, "additional properties 'imag' not allowed"),
    ({"modelControlMode": "pol"}, "value must be one of"),
    ({"modelRepository": "http://bucket/models"}, "modelRepository"),
    ({"autoscaling": {"engine": "vpa"}}, "value must be one of"),
])
def test_the_chart_refuses_values_outside_its_schema(values: dict[str, Any], text: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(text)):
        render(values)


def _flag(args: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(values) == 1, (name, args)
    return values[0]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_rendered_objects_are_wired_together(values: dict[str, Any]) -> None:
    objects = by_kind(render(values))
    deployment, service, pdb = objects["Deployment"], objects["Service"], objects["PodDisruptionBudget"]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"],
                     deployment["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    container = pod["spec"]["containers"][0]
    args, ports = container["args"], {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"]) == _flag(args, "metrics-port")
    preStop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(_flag(args, "exit-timeout-secs")) + preStop
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    # pystub's arenas are memfds: /dev/shm is only for clients' regions, mounted when sized
    if values.get("shmSizeLimit"):
        assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": values["shmSizeLimit"]}
    else:
        assert "/dev/shm" not in mounts and "dshm" not in volumes
    for scaler in (objects.get("ScaledObject"), objects.get("HorizontalPodAutoscaler")):
        if scaler is not None:
            assert scaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                        "name": deployment["metadata"]["name"]}
            assert "replicas" not in deployment["spec"]  # the autoscaler owns the count


def _metric_names() -> set[str]:
    """Every metric the autoscaling rules read: from the KEDA queries and the adapter's rule."""
    queries = [t["metadata"]["query"] for t in by_kind(render(VALUE_SETS["keda"]))["ScaledObject"]["spec"]["triggers"]]
    isvc = load_documents((CHART.parents[1] / "kserve" / "inferenceservice.yaml").read_text())[0]
    queries += [m["external"]["metric"]["query"] for m in isvc["spec"]["predictor"]["autoScaling"]["metrics"]]
    rule = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"][0]
    queries += [rule["seriesQuery"], rule["metricsQuery"]]
    return {name for query in queries for name in re.findall(r"\b([a-z_]+)\{", query)}


def test_autoscaling_reads_the_in_flight_metric_itself() -> None:
    """The chart's KEDA query, the KServe example and the adapter rule read pystub's own gauge,
    not a sum of two others that they would each have to keep in step."""
    assert _metric_names() == {"pystub_inflight_requests"}


def _containers_to_run() -> dict[str, dict[str, Any]]:
    runtime = load_documents((CHART.parents[1] / "kserve" / "servingruntime.yaml").read_text())[0]
    return {"chart": by_kind(render())["Deployment"]["spec"]["template"]["spec"]["containers"][0],
            "chart-poll": by_kind(render({"modelControlMode": "poll"}))["Deployment"]["spec"]["template"]["spec"]
            ["containers"][0], "servingruntime": runtime["spec"]["containers"][0]}


@pytest.mark.parametrize("name", ["chart", "chart-poll", "servingruntime"])
def test_the_rendered_command_probes_and_scaling_metrics_work_on_a_real_server(name: str) -> None:
    container = _containers_to_run()[name]
    # The rendered flags, with the repository and ports the test owns (loopback, ephemeral).
    owned = ("--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port=")
    args = [a for a in container["args"] if not a.startswith(owned)]
    with Backend(EXAMPLES, *args) as backend:
        port_of = {"http": backend.ports["http"], 8000: backend.ports["http"], 8080: backend.ports["http"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container and "httpGet" in container[probe]:
                get = container[probe]["httpGet"]
                url = f"http://127.0.0.1:{port_of[get['port']]}{get['path']}"
                with urllib.request.urlopen(url, timeout=5) as response:
                    assert response.status == 200, (probe, url)
        exposition = urllib.request.urlopen(backend.metrics_url, timeout=5).read().decode()
    exported = set(re.findall(r"^# TYPE (\w+) ", exposition, re.M))
    missing = _metric_names() - exported
    assert not missing, f"autoscaling reads metrics that pystub does not export: {missing}"


def _grpc_health_check(target: str, service: str) -> bytes:
    """grpc.health.v1.Health/Check as the kubelet's gRPC probe sends it (raw protobuf: field 1
    is the service name; the answer's field 1 is the status, SERVING = 1)."""
    import grpc

    request = (b"\x0a" + bytes([len(service)]) + service.encode()) if service else b""
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        return bytes(check(request, timeout=10))


def test_the_grpc_probes_get_serving_from_a_real_server() -> None:
    import grpc

    container = by_kind(render({"probes": {"grpc": True}}))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    owned = ("--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port=")
    with Backend(EXAMPLES, *[a for a in container["args"] if not a.startswith(owned)]) as backend:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == 8001
            try:
                answer = _grpc_health_check(backend.grpc_url, container[probe]["grpc"].get("service", ""))
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    pytest.skip("this server has no grpc.health.v1.Health service yet (being added to the "
                                "gRPC frontend); the chart's probes.grpc needs it")
                raise
            assert answer == b"\x08\x01", (probe, answer)  # status: SERVING
