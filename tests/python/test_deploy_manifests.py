"""deploy/: the container recipe and the Kubernetes manifests that run `gemma4 serve` as an inference
pool (issue 21), checked without a cluster: Deployment and Service against Kubernetes' own schemas
(kubernetes-validate, strict), InferencePool and InferenceObjective against the extension's API as
its reference documents it (the CRDs themselves cannot be fetched here), and the parts that must
agree with the binary: every container flag is a `serve` option, the probes hit /health on the
served port, the pool selects the servers, the grace period outlasts the drain, and the memory
request covers what `gemma4 fit` says the configuration needs. The image is not built here (no
Docker engine on these machines)."""
import re
import subprocess
from pathlib import Path

import pytest

from test_server import STARTER

yaml = pytest.importorskip("yaml")
REPO = Path(__file__).resolve().parents[2]
DOCS = list(yaml.safe_load_all((REPO / "deploy" / "k8s" / "gemma4-pool.yaml").read_text()))


def one(kind: str) -> dict:
    found = [d for d in DOCS if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def container() -> dict:
    return one("Deployment")["spec"]["template"]["spec"]["containers"][0]


def arg(name: str) -> str:
    a = container()["args"]
    return a[a.index(name) + 1]


def test_core_objects_validate_against_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    for kind in ("Deployment", "Service"):
        kv.validate(one(kind), "1.33.0", strict=True)  # raises on any unknown or ill-typed field


# inference.networking.k8s.io/v1 InferencePool and inference.networking.x-k8s.io/v1alpha2
# InferenceObjective, from the extension's API reference: required fields, types, limits.
PORT = {"type": "object", "required": ["number"], "additionalProperties": False,
        "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
SCHEMAS = {
    "InferencePool": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "inference.networking.k8s.io/v1"},
            "spec": {"type": "object", "required": ["selector", "targetPorts", "endpointPickerRef"],
                     "additionalProperties": False,
                     "properties": {
                         "selector": {"type": "object", "required": ["matchLabels"], "additionalProperties": False,
                                      "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                                     "additionalProperties": {"type": "string"}}}},
                         "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": PORT},
                         "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                         "endpointPickerRef": {"type": "object", "required": ["name"],
                                               "properties": {"name": {"type": "string", "minLength": 1},
                                                              "port": PORT,
                                                              "failureMode": {"enum": ["FailOpen", "FailClose"]}}}}}}},
    "InferenceObjective": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "inference.networking.x-k8s.io/v1alpha2"},
            "spec": {"type": "object", "required": ["poolRef"], "additionalProperties": False,
                     "properties": {"priority": {"type": "integer"},
                                    "poolRef": {"type": "object", "required": ["name"],
                                                "properties": {"name": {"type": "string", "minLength": 1}}}}}}},
}


def test_inference_objects_follow_the_extension_api():
    jsonschema = pytest.importorskip("jsonschema")
    for kind, schema in SCHEMAS.items():
        jsonschema.validate(one(kind), schema)
    ports = [p["number"] for p in one("InferencePool")["spec"]["targetPorts"]]
    assert len(ports) == len(set(ports))


def test_pool_selects_the_servers_and_probes_hit_health():
    pod_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    pool = one("InferencePool")
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert one("Service")["spec"]["selector"].items() <= pod_labels.items()
    served = container()["ports"][0]["containerPort"]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [served]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container()[probe]["httpGet"] == {"path": "/health", "port": served}
    assert one("InferenceObjective")["spec"]["poolRef"]["name"] == pool["metadata"]["name"]
    # The image's entrypoint serves on the port the manifests name.
    docker = (REPO / "deploy" / "Dockerfile").read_text()
    assert f'"--port", "{served}"' in docker and f"EXPOSE {served}" in docker


def test_flags_are_serve_options_and_the_drain_fits_the_grace_period(gemma4_bin):
    help_text = subprocess.run([str(gemma4_bin), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    docker = (REPO / "deploy" / "Dockerfile").read_text()
    entry = re.findall(r'"(--[a-z-]+)"', docker)
    for flag in [a for a in container()["args"] if a.startswith("--")] + entry:
        assert re.search(rf"(^|[ ,]){re.escape(flag)}\b", help_text, re.M), flag
    grace = one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > int(arg("--shutdown-timeout"))


def test_memory_request_covers_what_fit_computes(gemma4_bin):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    import json
    fit = json.loads(subprocess.run([str(gemma4_bin), "fit", "--model", str(STARTER), "--context", arg("--context"),
                                     "--parallel", arg("--parallel"), "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    need = fit["need_bytes"]["total"]
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", container()["resources"]["requests"]["memory"])
    assert m and int(m.group(1)) * units[m.group(2)] >= need, (need, container()["resources"])


def test_the_image_is_built_by_the_projects_own_setup():
    docker = (REPO / "deploy" / "Dockerfile").read_text()
    assert "RUN make build starter-model" in docker  # deps/apt.txt and requirements.txt through the Makefile
    assert "ENTRYPOINT [\"gemma4\", \"serve\"" in docker
